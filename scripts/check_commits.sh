#!/usr/bin/env bash
# Checks commit messages against the rule in CONTRIBUTING.md: a subject of at most 72 characters
# that starts with a subsystem prefix (lib: cuda: daemon: client: proto: tests: deploy: docs:,
# optionally with a path, e.g. tests/lib:), then a blank line, then a body.
#   scripts/check_commits.sh [BASE]          every non-merge commit in BASE..HEAD (default HEAD~1)
#   scripts/check_commits.sh --message FILE  one message (the commit-msg hook: .githooks/commit-msg)
# Exit status 1 when a message breaks the rule; each problem is printed.
set -euo pipefail
export LC_ALL=C.UTF-8

prefixes='lib|cuda|daemon|client|proto|tests|deploy|docs'

# check NAME < message; prints problems, returns 1 if any
check() {
  local name=$1 subject second body bad=0
  local msg
  msg=$(grep -v '^#' || true)
  subject=$(printf '%s\n' "$msg" | sed -n 1p)
  second=$(printf '%s\n' "$msg" | sed -n 2p)
  body=$(printf '%s\n' "$msg" | sed -n '3,$p' | grep -v '^[[:space:]]*$' || true)
  case "$subject" in
  "Merge "* | "Revert \""* | "fixup! "* | "squash! "*) return 0 ;;
  esac
  if [ ${#subject} -gt 72 ]; then
    echo "$name: subject has ${#subject} characters (at most 72): $subject"
    bad=1
  fi
  if ! printf '%s\n' "$subject" | grep -Eq "^($prefixes)(/[A-Za-z0-9_./-]+)?: [^ ]"; then
    echo "$name: subject does not start with a subsystem prefix ($prefixes followed by ': '): $subject"
    bad=1
  fi
  if [ -n "$second" ]; then
    echo "$name: the line after the subject must be blank"
    bad=1
  fi
  if [ -z "$body" ]; then
    echo "$name: no body (say why, and give the figures)"
    bad=1
  fi
  return $bad
}

if [ "${1:-}" = "--message" ]; then
  [ $# -eq 2 ] || { echo "usage: $0 --message FILE" >&2; exit 2; }
  check "commit message" < "$2"
  exit
fi

base=${1:-HEAD~1}
status=0
for c in $(git rev-list --no-merges --reverse "$base..HEAD"); do
  git log -1 --format=%B "$c" | check "$(git log -1 --format='%h' "$c")" || status=1
done
exit $status

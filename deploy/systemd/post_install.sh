#!/bin/sh
# meson install (not with --destdir): create dquantd's user and socket group right away, so the
# units start without manual set-up. Packages do this in their postinst (dh_installsysusers).
#   post_install.sh SYSUSERS_CONF   (absolute)
conf=$1
if [ "$(id -u)" -ne 0 ]; then
    echo "dquantd: not root, so the user and group were not created; run: systemd-sysusers $conf"
elif ! command -v systemd-sysusers >/dev/null 2>&1; then
    echo "dquantd: no systemd-sysusers; create the user dquantd and the group dquant as $conf says"
else
    systemd-sysusers "$conf" && echo "dquantd: user dquantd and group dquant are in place ($conf)"
fi
exit 0

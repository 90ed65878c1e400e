// Static checks of deploy/Dockerfile (meson test dockerfile): no Docker daemon needed.
//
//   node check_dockerfile.mjs DOCKERFILE CONTEXT TARGET,...   the rules below; TARGET,... are the
//       stages that are images (every other stage must be used by one of them)
//   node check_dockerfile.mjs --apt DOCKERFILE STAGE           print the packages STAGE installs
//
// Rules: the syntax (dockerfile-utils, the checker behind the Dockerfile language server); every
// base image pinned (a digest, or a tag naming an exact release, e.g. 12.11-slim or
// 12.8.1-runtime-ubuntu24.04, never latest or a moving name like bookworm); each target runs as a
// numeric non-root USER (so Kubernetes' runAsNonRoot can verify it), has a HEALTHCHECK and an
// ENTRYPOINT or CMD; COPY --from names an earlier stage; apt-get install uses
// --no-install-recommends and removes the lists in the same RUN; CONTEXT/.dockerignore exists,
// keeps build folders, VCS data and local environments out and lets in every file COPY takes.
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { DockerfileParser } from "dockerfile-ast";
import { validate } from "dockerfile-utils";

function stagesOf(text) {
    const df = DockerfileParser.parse(text);
    const args = {};
    const stages = [];
    for (const ins of df.getInstructions()) {
        const kw = ins.getKeyword();
        // flags (COPY --from=...) are not among the arguments in dockerfile-ast
        const flags = typeof ins.getFlags === "function" ? ins.getFlags().map((f) => `--${f.getName()}=${f.getValue()}`) : [];
        const words = [...flags, ...ins.getArguments().map((a) => a.getValue())];
        if (kw === "FROM") {
            const asAt = words.findIndex((w) => w.toUpperCase() === "AS");
            stages.push({ image: words.find((w) => !w.startsWith("--")), name: asAt >= 0 ? words[asAt + 1] : null, ins: [], line: ins.getRange().start.line + 1 });
        } else if (!stages.length && kw === "ARG") {
            for (const w of words) {
                const eq = w.indexOf("=");
                if (eq > 0) args[w.slice(0, eq)] = w.slice(eq + 1);
            }
        } else if (stages.length) {
            stages.at(-1).ins.push({ kw, words, line: ins.getRange().start.line + 1, text: ins.getTextContent() });
        }
    }
    for (const s of stages) s.image = s.image.replace(/\$\{?(\w+)\}?/g, (_, v) => args[v] ?? `<unset ${v}>`);
    return stages;
}

// .dockerignore as Docker reads it: patterns relative to the context, * within a folder, ** over
// folders, ! re-includes; a path is out if it or a folder above it matches (the last pattern wins).
function ignoreMatcher(text) {
    const rules = text.split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("#")).map((l) => {
        const neg = l.startsWith("!");
        const pat = path.posix.normalize((neg ? l.slice(1) : l).replace(/^\/+/, ""));
        const re = pat.split(/(\*\*\/?|\*|\?)/).map((part) =>
            part === "**/" ? "(?:.*/)?" : part === "**" ? ".*" : part === "*" ? "[^/]*" : part === "?" ? "[^/]"
                : part.replace(/[.+^${}()|[\]\\]/g, "\\$&")).join("");
        return { neg, re: new RegExp(`^${re}$`) };
    });
    return (p) => {
        const parts = p.split("/");
        let out = false;
        for (let i = 1; i <= parts.length; i++) {
            const prefix = parts.slice(0, i).join("/");
            for (const r of rules) if (r.re.test(prefix)) out = !r.neg;
            if (out) return true;
        }
        return out;
    };
}

function aptPackages(stage) {
    const pkgs = [];
    for (const i of stage.ins.filter((x) => x.kw === "RUN")) {
        const w = i.words;
        for (let k = 0; k < w.length; k++) {
            if (w[k] !== "apt-get" || w[k + 1] !== "install") continue;
            for (k += 2; k < w.length && !["&&", ";", "||"].includes(w[k]); k++) if (!w[k].startsWith("-")) pkgs.push(w[k]);
        }
    }
    return pkgs;
}

function check(dockerfile, context, targets) {
    const text = readFileSync(dockerfile, "utf8");
    const p = [];
    for (const d of validate(text)) p.push(`line ${d.range.start.line + 1}: ${d.message}`);
    const stages = stagesOf(text);
    const names = new Set();
    const used = new Set();
    for (const s of stages) {
        if (names.has(s.image)) used.add(s.image);
        else {
            const [, tag, digest] = s.image.match(/^[^:@]+(?::([^@]+))?(?:@(sha256:[0-9a-f]{64}))?$/) ?? [];
            if (!digest && !(tag && tag !== "latest" && /\d+\.\d+/.test(tag)))
                p.push(`line ${s.line}: base image ${s.image} is not pinned (a digest, or a tag naming an exact release)`);
        }
        for (const i of s.ins) {
            const from = i.kw === "COPY" && i.words.find((w) => w.startsWith("--from="));
            if (from) {
                const src = from.slice("--from=".length);
                if (!names.has(src)) p.push(`line ${i.line}: COPY --from=${src} is not an earlier stage`);
                used.add(src);
            }
            if (i.kw === "RUN" && /apt-get\s+install/.test(i.text)) {
                if (!/--no-install-recommends/.test(i.text)) p.push(`line ${i.line}: apt-get install without --no-install-recommends`);
                if (!/rm -rf \/var\/lib\/apt\/lists/.test(i.text)) p.push(`line ${i.line}: apt lists not removed in the RUN that installs`);
            }
        }
        if (s.name) names.add(s.name);
    }
    const leaves = stages.filter((s) => !used.has(s.name)).map((s) => s.name ?? "(unnamed)");
    if (leaves.sort().join(",") !== [...targets].sort().join(","))
        p.push(`the images built are ${leaves.join(", ")}; expected ${targets.join(", ")}`);
    for (const t of targets) {
        const s = stages.find((x) => x.name === t);
        if (!s) continue;
        const user = s.ins.filter((i) => i.kw === "USER").at(-1)?.words[0];
        if (!user) p.push(`stage ${t}: no USER (it would run as root)`);
        else if (!/^\d+(:\d+)?$/.test(user) || /^0(:|$)/.test(user))
            p.push(`stage ${t}: USER ${user} is not a numeric non-root uid`);
        const hc = s.ins.filter((i) => i.kw === "HEALTHCHECK").at(-1);
        if (!hc || hc.words[0]?.toUpperCase() === "NONE") p.push(`stage ${t}: no HEALTHCHECK`);
        if (!s.ins.some((i) => i.kw === "ENTRYPOINT" || i.kw === "CMD")) p.push(`stage ${t}: no ENTRYPOINT or CMD`);
    }
    // The build context.
    const di = path.join(context, ".dockerignore");
    if (!existsSync(di)) return [...p, `${di} is missing`];
    const ignored = ignoreMatcher(readFileSync(di, "utf8"));
    for (const out of [".git/config", "build/build.ninja", "build-asan/build.ninja", ".venv/bin/python", ".models/x",
        ".debs/x.deb", "tests/deploy/node_modules/yaml/package.json", "client/python/build/lib/x.py", "lib/__pycache__/x.pyc"])
        if (!ignored(out)) p.push(`.dockerignore lets ${out} into the build context`);
    for (const s of stages)
        for (const i of s.ins.filter((x) => (x.kw === "COPY" || x.kw === "ADD") && !x.words.some((w) => w.startsWith("--from="))))
            for (const src of i.words.filter((w) => !w.startsWith("--")).slice(0, -1)) {
                const want = src === "." ? ["meson.build", "lib/meson.build", "deploy/meson.build", "proto/dquant.proto"] : [path.posix.normalize(src)];
                for (const f of want) {
                    if (ignored(f)) p.push(`line ${i.line}: COPY ${src}: .dockerignore keeps ${f} out`);
                    if (!existsSync(path.join(context, f))) p.push(`line ${i.line}: COPY ${src}: no ${f} in the context`);
                }
            }
    return p;
}

const argv = process.argv.slice(2);
if (argv[0] === "--apt" && argv.length === 3) {
    const s = stagesOf(readFileSync(argv[1], "utf8")).find((x) => x.name === argv[2]);
    if (!s) {
        console.error(`no stage ${argv[2]}`);
        process.exit(1);
    }
    console.log(aptPackages(s).join("\n"));
} else if (argv.length === 3) {
    const targets = argv[2].split(",");
    const problems = check(argv[0], argv[1], targets);
    for (const s of problems) console.error(`${argv[0]}: ${s}`);
    if (!problems.length) console.log(`${argv[0]}: valid; images ${targets.join(", ")}: pinned bases, non-root, HEALTHCHECK; .dockerignore in place`);
    process.exit(problems.length ? 1 : 0);
} else {
    console.error("usage: check_dockerfile.mjs DOCKERFILE CONTEXT TARGET,... | --apt DOCKERFILE STAGE");
    process.exit(2);
}

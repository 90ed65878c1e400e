// Offline checks of the Kubernetes manifests in deploy/kubernetes/rendered (meson tests
// k8s-manifests and k8s-kustomize). Needs the packages of tests/deploy/package.json
// (scripts/setup.sh runs npm ci); no cluster, no network.
//
//   node check_manifests.mjs check VARIANT=FILE...   every object of each file:
//       1. against the Kubernetes API schema of its kind (kubernetes-models: required fields,
//          types, enums, formats; ServiceMonitor from the prometheus-operator models);
//       2. no unknown fields: the objects type-checked as object literals against the same
//          models' TypeScript interfaces (a misspelt key such as readinesProbe is an error, as
//          the API server's strict field validation would make it);
//       3. what dquantd needs of them (rules below), VARIANT cpu or gpu.
//   node check_manifests.mjs same FILE_A FILE_B   the two hold the same objects (kustomize's
//       output against the checked-in rendering; formatting and key order aside).
//   node check_manifests.mjs self-test FILE      breaks FILE's objects in known ways and fails
//       unless every check above catches every break.
// Exit 0 when all is well, 1 with one line per problem otherwise, 2 on bad usage.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { isDeepStrictEqual } from "node:util";
import YAML from "yaml";
import ts from "typescript";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);

// apiVersion/kind -> the model's module (its class validates, its I<Kind> interface types).
function modelModule(apiVersion, kind) {
    if (apiVersion === "monitoring.coreos.com/v1")
        return `@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/${kind}`;
    return `kubernetes-models/${apiVersion}/${kind}`;
}

function readDocs(file) {
    const docs = YAML.parseAllDocuments(readFileSync(file, "utf8"), { uniqueKeys: true });
    const out = [];
    for (const d of docs) {
        if (d.errors.length) throw new Error(`${file}: ${d.errors[0].message}`);
        const v = d.toJS();
        if (v !== null) out.push(v);
    }
    return out;
}

const label = (o) => `${o?.kind ?? "?"}/${o?.metadata?.name ?? "?"}`;

// 1. The API schema of each object's kind.
async function schemaProblems(objs) {
    const problems = [];
    for (const o of objs) {
        let mod;
        try {
            mod = await import(modelModule(o.apiVersion, o.kind));
        } catch {
            problems.push(`${label(o)}: no schema for ${o.apiVersion} ${o.kind}`);
            continue;
        }
        const Model = mod[o.kind];
        try {
            new Model(o).validate();
        } catch (e) {
            const errs = e.errors ?? [{ instancePath: "", message: e.message }];
            for (const err of errs)
                problems.push(`${label(o)}: schema: ${err.instancePath || "/"} ${err.message}` +
                    (err.params?.allowedValues ? ` (${err.params.allowedValues.join(", ")})` : ""));
        }
    }
    return problems;
}

// 2. Unknown fields and wrong types: `const d: IStatefulSet = {...}` for every object, compiled
// by TypeScript against the models' declarations. An object literal may not carry a property its
// type does not declare, at any depth.
function typeProblems(objs) {
    const lines = [];
    const spans = [];
    objs.forEach((o, i) => {
        const iface = `I${o.kind}`;
        lines.push(`import type { ${iface} as T${i} } from "${modelModule(o.apiVersion, o.kind)}";`);
    });
    objs.forEach((o, i) => {
        const start = lines.length;
        lines.push(...`export const d${i}: T${i} = ${JSON.stringify(o, null, 2)};`.split("\n"));
        spans.push([start, lines.length, o]);
    });
    const fileName = path.join(here, "__manifests__.ts");
    const source = lines.join("\n");
    const options = {
        strict: true, noEmit: true, skipLibCheck: true, types: [],
        target: ts.ScriptTarget.ES2020, module: ts.ModuleKind.Node16, moduleResolution: ts.ModuleResolutionKind.Node16,
    };
    const host = ts.createCompilerHost(options);
    const getSourceFile = host.getSourceFile;
    host.getSourceFile = (name, lang, ...rest) =>
        name === fileName ? ts.createSourceFile(name, source, lang) : getSourceFile.call(host, name, lang, ...rest);
    const fileExists = host.fileExists;
    host.fileExists = (name) => name === fileName || fileExists.call(host, name);
    const program = ts.createProgram([fileName], options, host);
    return ts.getPreEmitDiagnostics(program).map((d) => {
        const msg = ts.flattenDiagnosticMessageText(d.messageText, " ");
        if (!d.file || d.file.fileName !== fileName) return `types: ${msg}`;
        const { line } = d.file.getLineAndCharacterOfPosition(d.start);
        const span = spans.find(([a, b]) => line >= a && line < b);
        const at = span ? `${label(span[2])} (${lines[line].trim().slice(0, 60)})` : `import line ${line + 1}`;
        return `${at}: ${msg}`;
    });
}

// dquantd.ini as dquantd reads it: [section], key = value, ; and # comments, repeated keys.
function parseIni(text) {
    const ini = {};
    let sec = "";
    for (const raw of text.split("\n")) {
        const line = raw.trim();
        if (!line || line.startsWith(";") || line.startsWith("#")) continue;
        const m = line.match(/^\[(.+)\]$/);
        if (m) {
            sec = m[1];
            ini[sec] ??= {};
            continue;
        }
        const eq = line.indexOf("=");
        if (eq < 0) continue;
        const k = line.slice(0, eq).trim();
        (ini[sec] ??= {})[k] = [...(ini[sec][k] ?? []), line.slice(eq + 1).trim()];
    }
    return ini;
}

const UNITS = { K: 2 ** 10, M: 2 ** 20, G: 2 ** 30, T: 2 ** 40, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40 };
function bytes(s) {
    const m = String(s).match(/^(\d+)(Ki|Mi|Gi|Ti|K|M|G|T)?$/);
    return m ? Number(m[1]) * (m[2] ? UNITS[m[2]] : 1) : NaN;
}
const matches = (sel, labels) => !!sel && Object.entries(sel).every(([k, v]) => labels?.[k] === v);

// 3. What dquantd needs of the objects: members with stable names behind a headless Service, the
// configuration and secret mounted where dquantd.ini and --config say, probes and scraping on
// the metrics listener, which must listen on the pod's IP.
function dquantdProblems(objs, variant) {
    const p = [];
    const one = (kind) => {
        const found = objs.filter((o) => o.kind === kind);
        if (found.length !== 1) p.push(`expected one ${kind}, found ${found.length}`);
        return found[0];
    };
    const sts = one("StatefulSet"), svc = one("Service"), cm = one("ConfigMap");
    const pdb = one("PodDisruptionBudget"), sm = one("ServiceMonitor");
    if (!sts || !svc || !cm || !pdb || !sm) return p;
    const pod = sts.spec?.template ?? {};
    const podLabels = pod.metadata?.labels ?? {};
    const spec = pod.spec ?? {};
    const c = (spec.containers ?? []).find((x) => x.name === "dquantd");
    if (!c) return [...p, "StatefulSet: no container named dquantd"];

    if (!matches(sts.spec.selector?.matchLabels, podLabels)) p.push("StatefulSet: selector does not match the pod labels");
    if (svc.spec?.clusterIP !== "None") p.push("Service: not headless (clusterIP: None): members need their own DNS names");
    if (sts.spec.serviceName !== svc.metadata.name) p.push(`StatefulSet: serviceName ${sts.spec.serviceName} is not the headless Service ${svc.metadata.name}`);
    if (!matches(svc.spec?.selector, podLabels)) p.push("Service: selector does not match the pod labels");
    if (!((sts.spec.replicas ?? 1) >= 2)) p.push("StatefulSet: fewer than 2 replicas");

    const ports = Object.fromEntries((c.ports ?? []).map((x) => [x.name, x.containerPort]));
    for (const name of ["dquant", "metrics"]) if (!ports[name]) p.push(`container: no port named ${name}`);
    const svcPorts = Object.fromEntries((svc.spec.ports ?? []).map((x) => [x.name, x]));
    for (const [name, sp] of Object.entries(svcPorts)) {
        const t = sp.targetPort ?? sp.port;
        if (typeof t === "string" ? !(t in ports) : !Object.values(ports).includes(t))
            p.push(`Service port ${name}: targetPort ${t} is not a container port`);
    }
    if (!svcPorts.dquant) p.push("Service: no port named dquant (the SRV record _dquant._tcp clients look up)");

    for (const probe of ["readinessProbe", "livenessProbe", "startupProbe"]) {
        const h = c[probe]?.httpGet;
        if (!h) {
            p.push(`container: no ${probe} (httpGet /healthz)`);
            continue;
        }
        if (h.path !== "/healthz") p.push(`${probe}: path ${h.path}, not /healthz`);
        const port = typeof h.port === "string" ? ports[h.port] : h.port;
        if (port !== ports.metrics) p.push(`${probe}: port ${h.port} is not the metrics port`);
    }

    // The configuration: --config names a file of the mounted ConfigMap.
    const cfgArg = (c.args ?? []).find((a) => a.startsWith("--config=")) ?? "";
    const cfgPath = cfgArg.slice("--config=".length);
    const mountOf = (volName) => (c.volumeMounts ?? []).find((m) => m.name === volName);
    const vol = (spec.volumes ?? []).find((v) => v.configMap?.name === cm.metadata.name);
    const cfgMount = vol && mountOf(vol.name);
    if (!cfgMount) p.push(`no volume mounts ConfigMap ${cm.metadata.name}`);
    else if (path.posix.dirname(cfgPath) !== cfgMount.mountPath || !(path.posix.basename(cfgPath) in (cm.data ?? {})))
        p.push(`--config ${cfgPath || "(missing)"} is not a file of ConfigMap ${cm.metadata.name} at ${cfgMount.mountPath}`);
    const ini = parseIni(cm.data?.[path.posix.basename(cfgPath)] ?? "");

    // Listeners: clients' TCP port and the metrics listener on the pod's IP, not loopback only.
    const listen = ini.server?.listen ?? [];
    const tcp = listen.map((l) => l.match(/^tcp:\/\/(.+):(\d+)$/)).filter(Boolean);
    if (!tcp.some((m) => Number(m[2]) === ports.dquant && ["0.0.0.0", "[::]"].includes(m[1])))
        p.push(`dquantd.ini: no [server] listen = tcp://0.0.0.0:${ports.dquant} (listen = ${listen.join(", ") || "default, loopback"})`);
    const metrics = ini.metrics?.listen?.at(-1) ?? "127.0.0.1:9733";
    const mm = metrics.match(/^(.+):(\d+)$/);
    if (!mm || !["0.0.0.0", "[::]", "::"].includes(mm[1]))
        p.push(`dquantd.ini: [metrics] listen = ${metrics} is not reachable on the pod's IP (probes, Prometheus): use 0.0.0.0:PORT`);
    else if (Number(mm[2]) !== ports.metrics)
        p.push(`dquantd.ini: [metrics] port ${mm[2]} is not the container's metrics port ${ports.metrics}`);

    // The shared secret: from the Secret volume, at the path dquantd.ini names.
    const secretFile = ini.server?.secret_file?.at(-1);
    const sVol = (spec.volumes ?? []).find((v) => v.secret);
    const sMount = sVol && mountOf(sVol.name);
    if (!sVol || !sMount) p.push("no Secret volume mounted for the shared secret");
    else if (!secretFile || path.posix.dirname(secretFile) !== sMount.mountPath)
        p.push(`dquantd.ini: secret_file ${secretFile ?? "(none)"} is not in the Secret's mount ${sMount.mountPath}`);
    if (ini.server?.secret) p.push("dquantd.ini: the secret itself is in the ConfigMap; use secret_file");

    // Backend, resources, GPU.
    const backend = ini.server?.backend?.at(-1) ?? "cpu";
    const res = c.resources ?? {};
    const gpus = Number(res.limits?.["nvidia.com/gpu"] ?? 0);
    if (variant === "gpu") {
        if (backend !== "cuda") p.push(`gpu variant: backend = ${backend}, not cuda`);
        if (!(gpus >= 1)) p.push("gpu variant: no nvidia.com/gpu in the container's limits");
    } else {
        if (backend !== "cpu") p.push(`cpu variant: backend = ${backend}`);
        if (gpus) p.push("cpu variant: requests nvidia.com/gpu");
    }
    for (const r of ["cpu", "memory"]) if (!res.requests?.[r]) p.push(`container: no ${r} request`);
    const memLimit = bytes(res.limits?.memory);
    if (!memLimit) p.push("container: no memory limit");
    const hostMem = bytes(ini.store?.host_memory?.at(-1) ?? "4G");
    if (memLimit && !(hostMem < memLimit)) p.push(`dquantd.ini: host_memory ${ini.store.host_memory} is not below the memory limit ${res.limits.memory}`);

    // Shutdown: preStop plus dquantd's drain fit in the grace period.
    const grace = spec.terminationGracePeriodSeconds ?? 30;
    const drain = Number(ini.server?.shutdown_timeout?.at(-1) ?? 30);
    const pre = c.lifecycle?.preStop?.exec?.command;
    const preSleep = pre && pre[0] === "sleep" ? Number(pre[1]) : 0;
    if (!(preSleep + drain < grace)) p.push(`terminationGracePeriodSeconds ${grace} <= preStop ${preSleep} s + shutdown_timeout ${drain} s`);

    // Not root, no escalation.
    const psc = spec.securityContext ?? {}, csc = c.securityContext ?? {};
    if (!(psc.runAsNonRoot || csc.runAsNonRoot)) p.push("pod: runAsNonRoot is not set");
    if ((csc.runAsUser ?? psc.runAsUser) === 0) p.push("pod: runs as root");
    if (csc.allowPrivilegeEscalation !== false) p.push("container: allowPrivilegeEscalation is not false");
    if (csc.readOnlyRootFilesystem !== true) p.push("container: root filesystem is writable");
    if (!(csc.capabilities?.drop ?? []).includes("ALL")) p.push("container: capabilities not dropped");

    // One member per node.
    const aa = spec.affinity?.podAntiAffinity ?? {};
    const terms = [...(aa.requiredDuringSchedulingIgnoredDuringExecution ?? []),
        ...(aa.preferredDuringSchedulingIgnoredDuringExecution ?? []).map((t) => t.podAffinityTerm)];
    if (!terms.some((t) => t?.topologyKey === "kubernetes.io/hostname" && matches(t.labelSelector?.matchLabels, podLabels)))
        p.push("pod: no anti-affinity across nodes (topologyKey kubernetes.io/hostname, selecting these pods)");

    if (!matches(pdb.spec?.selector?.matchLabels, podLabels)) p.push("PodDisruptionBudget: selector does not match the pod labels");
    if (pdb.spec?.maxUnavailable === undefined && pdb.spec?.minAvailable === undefined) p.push("PodDisruptionBudget: no budget");

    // Scraping: the ServiceMonitor reaches the metrics port through the Service; annotations agree.
    if (!matches(sm.spec?.selector?.matchLabels, svc.metadata.labels)) p.push("ServiceMonitor: selector does not match the Service's labels");
    for (const ep of sm.spec?.endpoints ?? []) {
        const sp = svcPorts[ep.port];
        if (!sp) p.push(`ServiceMonitor: port ${ep.port} is not a Service port`);
        else if ((typeof sp.targetPort === "string" ? ports[sp.targetPort] : sp.targetPort) !== ports.metrics)
            p.push(`ServiceMonitor: port ${ep.port} does not lead to the metrics port`);
        if ((ep.path ?? "/metrics") !== "/metrics") p.push(`ServiceMonitor: path ${ep.path}`);
    }
    const ann = pod.metadata?.annotations ?? {};
    if (ann["prometheus.io/scrape"] !== "true" || Number(ann["prometheus.io/port"]) !== ports.metrics || ann["prometheus.io/path"] !== "/metrics")
        p.push("pod: prometheus.io/scrape, /port, /path annotations do not point at the metrics listener");
    return p;
}

async function check(variant, objs) {
    return [...(await schemaProblems(objs)), ...typeProblems(objs), ...dquantdProblems(objs, variant)];
}

// Known breaks of a good rendering; each must be caught, by the check named.
const BREAKS = [
    ["misspelt probe key (unknown field)", (o) => { const c = ctr(o); c.readinesProbe = c.readinessProbe; delete c.readinessProbe; }],
    ["unknown field deep in the pod", (o) => { sts(o).spec.template.spec.securityContext.runAsNonroot = true; }],
    ["containerPort as a string (schema)", (o) => { ctr(o).ports[0].containerPort = "7733"; }],
    ["bad imagePullPolicy (schema enum)", (o) => { ctr(o).imagePullPolicy = "Sometimes"; }],
    ["StatefulSet without selector (schema required)", (o) => { delete sts(o).spec.selector; }],
    ["ServiceMonitor port not on the Service", (o) => { kind(o, "ServiceMonitor").spec.endpoints[0].port = "http"; }],
    ["metrics on loopback only", (o) => { const cm = kind(o, "ConfigMap"); const k = Object.keys(cm.data)[0]; cm.data[k] = cm.data[k].replace(/\[metrics\][^]*$/, "[metrics]\nlisten = 127.0.0.1:9733\n"); }],
    ["Service not headless", (o) => { kind(o, "Service").spec.clusterIP = "10.0.0.1"; }],
    ["probe on the client port", (o) => { ctr(o).livenessProbe.httpGet.port = "dquant"; }],
    ["no anti-affinity", (o) => { delete sts(o).spec.template.spec.affinity; }],
    ["PDB selecting other pods", (o) => { kind(o, "PodDisruptionBudget").spec.selector.matchLabels = { app: "other" }; }],
];
const kind = (objs, k) => objs.find((o) => o.kind === k);
const sts = (objs) => kind(objs, "StatefulSet");
const ctr = (objs) => sts(objs).spec.template.spec.containers[0];

async function main() {
    const [cmd, ...args] = process.argv.slice(2);
    const problems = [];
    if (cmd === "check" && args.length) {
        for (const a of args) {
            const [variant, file] = a.split("=");
            if (!["cpu", "gpu"].includes(variant) || !file) return usage();
            const objs = readDocs(file);
            const found = await check(variant, objs);
            problems.push(...found.map((s) => `${file}: ${s}`));
            if (!found.length) console.log(`${file}: ${objs.length} objects (${objs.map(label).join(", ")}) valid, ${variant} variant`);
        }
    } else if (cmd === "same" && args.length === 2) {
        const [a, b] = args.map(readDocs);
        const key = (o) => `${o.apiVersion} ${label(o)}`;
        const mb = new Map(b.map((o) => [key(o), o]));
        for (const o of a) {
            if (!mb.has(key(o))) problems.push(`${args[1]}: no ${key(o)}`);
            else if (!isDeepStrictEqual(o, mb.get(key(o)))) problems.push(`${key(o)} differs between ${args[0]} and ${args[1]}`);
            mb.delete(key(o));
        }
        for (const k of mb.keys()) problems.push(`${args[0]}: no ${k}`);
        if (!problems.length) console.log(`${args[0]} and ${args[1]}: the same ${a.length} objects`);
    } else if (cmd === "self-test" && args.length === 1) {
        const [variant, file] = args[0].split("=");
        const good = readDocs(file);
        const base = await check(variant, good);
        if (base.length) problems.push(`${file} is not valid to start with: ${base[0]}`);
        for (const [what, brk] of BREAKS) {
            const objs = structuredClone(good);
            brk(objs);
            const found = await check(variant, objs);
            if (!found.length) problems.push(`self-test: not caught: ${what}`);
            else console.log(`self-test: caught ${what}: ${found[0]}`);
        }
        if (!problems.length) console.log(`self-test: all ${BREAKS.length} breaks caught`);
    } else return usage();
    for (const s of problems) console.error(s);
    process.exitCode = problems.length ? 1 : 0;
}

function usage() {
    console.error("usage: check_manifests.mjs check cpu|gpu=FILE... | same FILE_A FILE_B | self-test cpu|gpu=FILE");
    process.exitCode = 2;
}

await main();

"""A local pod executor: runs a rendered batch/v1 Job's pods as local processes. A test utility only.

It plays the kubelet closely enough to prove that what kubetune renders agrees with what the worker and
``kubetune fetch`` expect: the commands, the paths, the env. For each pod of the Job (one per completion
index; all at once, like ``parallelism``) it:

- gives every volume a temp directory: ``emptyDir`` per pod, ``persistentVolumeClaim`` shared by claim
  name, ``configMap`` filled from the rendered ConfigMaps, ``secret`` filled from the test's values;
- maps each ``volumeMount`` (``subPath`` included) to its volume's directory and rewrites absolute mount
  paths wherever they appear in ``command``, ``args``, ``workingDir`` and env values;
- resolves env as the kubelet does: ``envFrom`` then ``env``, ``value``, ``secretKeyRef`` and
  ``configMapKeyRef`` (a missing non-optional key fails the container like CreateContainerConfigError),
  ``fieldRef`` (name, namespace, labels, annotations, pod IP), ``$(VAR)`` expansion, and the
  ``JOB_COMPLETION_INDEX`` an Indexed Job injects;
- maps the pods' DNS names (``<job>-<index>.<subdomain>``) to 127.0.0.1 and each declared containerPort
  to a free local port, so several pods rendezvous on one machine;
- runs the init containers in order, then the containers, and stops every pod when one fails
  (``restartPolicy: Never``, ``backoffLimit: 0``).

Nothing else of a cluster is imitated (no images, no resource limits, no security contexts): the
processes run from ``bin_dirs`` (the test's virtualenv) with only the rendered env plus PATH and HOME, and
the test process's PYTHONPATH when it has one: the image's installed kubetune is the package under test,
also when that is a checkout other than the one the virtualenv installed.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
_VAR = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")
_FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


class PodSpecError(Exception):
    """The pod cannot start (what the kubelet reports as CreateContainerConfigError and the like)."""


@dataclass
class ContainerRun:
    name: str
    argv: list[str]
    env: dict[str, str]
    returncode: int | None = None
    output: str = ""


@dataclass
class PodRun:
    """One pod's run: its containers in order, and where its volumes live on this machine."""

    name: str
    index: int
    mounts: dict[str, Path]  # mountPath in the pod -> host directory (the main container's view)
    containers: list[ContainerRun] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.containers) and all(c.returncode == 0 for c in self.containers)

    def host_path(self, pod_path: str) -> Path:
        """Where a path inside the pod lives on this machine."""
        for mount in sorted(self.mounts, key=len, reverse=True):
            if pod_path == mount or pod_path.startswith(mount.rstrip("/") + "/"):
                return self.mounts[mount] / pod_path[len(mount) :].lstrip("/")
        raise KeyError(f"{pod_path} is on no volume")

    def output(self, container: str) -> str:
        return next(c.output for c in self.containers if c.name == container)

    def describe(self) -> str:
        parts = [f"pod {self.name}: " + (self.error or ("ok" if self.ok else "failed"))]
        for c in self.containers:
            parts.append(f"--- {c.name} (exit {c.returncode}): {' '.join(c.argv)}\n{c.output[-4000:]}")
        return "\n".join(parts)


class PodExecutor:
    """Run the Job found in ``objects`` (a render: ConfigMaps, Services and one Job).

    Args:
        objects: the rendered objects.
        workdir: where volumes and logs go.
        secrets: Secret name -> {key: value}, what the cluster's Secrets would hold.
        bin_dirs: searched first for each command (e.g. the virtualenv's bin/).
        extra_env: added to every process (e.g. offline switches for the test machine).
        timeout: seconds for the whole Job.
    """

    def __init__(
        self,
        objects: list[dict],
        *,
        workdir: Path,
        secrets: dict[str, dict[str, str]] | None = None,
        bin_dirs: list[Path] | None = None,
        extra_env: dict[str, str] | None = None,
        timeout: float = 600,
    ) -> None:
        jobs = [o for o in objects if o["kind"] == "Job"]
        if len(jobs) != 1:
            raise ValueError(f"expected one Job in the render, found {len(jobs)}")
        self.job = jobs[0]
        self.configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"}
        self.workdir = Path(workdir)
        self.secrets = secrets or {}
        self.bin_dirs = [Path(p) for p in (bin_dirs or [])]
        self.extra_env = extra_env or {}
        self.timeout = timeout
        self._stop = threading.Event()
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        spec = self.job["spec"]
        self.indexed = spec.get("completionMode") == "Indexed"
        self.completions = int(spec.get("completions", 1))
        pod_spec = spec["template"]["spec"]
        ports = [p["containerPort"] for c in pod_spec.get("initContainers", []) + pod_spec["containers"] for p in c.get("ports", [])]
        self.aliases: dict[str, str] = {str(p): str(_free_port()) for p in sorted(set(ports))}
        sub = pod_spec.get("subdomain")
        if sub:
            ns = self.job["metadata"].get("namespace", "default")
            for i in range(self.completions):
                host = f"{self.job['metadata']['name']}-{i}.{sub}"
                for name in (host, f"{host}.{ns}.svc", f"{host}.{ns}.svc.cluster.local"):
                    self.aliases[name] = "127.0.0.1"

    # --- running -----------------------------------------------------------------------------
    def run(self) -> list[PodRun]:
        """Run every pod of the Job; returns them in index order."""
        pods = [self._prepare(i) for i in range(self.completions)]
        threads = [threading.Thread(target=self._run_pod, args=(p, pod_spec, meta), daemon=True) for p, pod_spec, meta in pods]
        deadline = time.monotonic() + self.timeout
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads):
            self._halt()
            for t in threads:
                t.join(10)
            for p, _, _ in pods:
                p.error = p.error or f"timed out after {self.timeout:.0f}s"
        return [p for p, _, _ in pods]

    def _prepare(self, index: int) -> tuple[PodRun, dict, dict]:
        job_name = self.job["metadata"]["name"]
        name = f"{job_name}-{index}-local" if self.indexed else f"{job_name}-local"
        tmpl = self.job["spec"]["template"]
        meta = {
            "name": name,
            "namespace": self.job["metadata"].get("namespace", "default"),
            "labels": dict(tmpl.get("metadata", {}).get("labels", {})),
            "annotations": dict(tmpl.get("metadata", {}).get("annotations", {})),
        }
        if self.indexed:
            meta["labels"][COMPLETION_INDEX] = meta["annotations"][COMPLETION_INDEX] = str(index)
        pod_dir = self.workdir / name
        volumes = {v["name"]: self._volume(v, pod_dir) for v in tmpl["spec"].get("volumes", [])}
        main = tmpl["spec"]["containers"][0]
        return PodRun(name, index, self._mounts(main, volumes)), {**tmpl["spec"], "_volumes": volumes, "_dir": pod_dir}, meta

    def _volume(self, vol: dict, pod_dir: Path) -> Path:
        if "emptyDir" in vol:
            path = pod_dir / "volumes" / vol["name"]
        elif "persistentVolumeClaim" in vol:
            path = self.workdir / "pvc" / vol["persistentVolumeClaim"]["claimName"]
        elif "configMap" in vol:
            path = pod_dir / "volumes" / vol["name"]
            data = self.configmaps.get(vol["configMap"]["name"])
            if data is None:
                raise PodSpecError(f"configmap \"{vol['configMap']['name']}\" not found")
            self._fill(path, data, vol["configMap"].get("items"))
        elif "secret" in vol:
            path = pod_dir / "volumes" / vol["name"]
            data = self.secrets.get(vol["secret"]["secretName"])
            if data is None:
                raise PodSpecError(f"secret \"{vol['secret']['secretName']}\" not found")
            self._fill(path, data, vol["secret"].get("items"))
        else:
            raise PodSpecError(f"volume {vol['name']}: the pod executor supports emptyDir, persistentVolumeClaim, configMap and secret")
        path.mkdir(parents=True, exist_ok=True)
        return path

    @staticmethod
    def _fill(path: Path, data: dict[str, str], items: list[dict] | None) -> None:
        path.mkdir(parents=True, exist_ok=True)
        for key, value in data.items():
            rel = next((i["path"] for i in items or [] if i["key"] == key), None if items else key)
            if rel:
                (path / rel).parent.mkdir(parents=True, exist_ok=True)
                (path / rel).write_text(value, encoding="utf-8")

    @staticmethod
    def _mounts(container: dict, volumes: dict[str, Path]) -> dict[str, Path]:
        out = {}
        for m in container.get("volumeMounts", []):
            host = volumes[m["name"]] / m.get("subPath", "")
            host.mkdir(parents=True, exist_ok=True)
            out[m["mountPath"]] = host
        return out

    def _run_pod(self, pod: PodRun, spec: dict, meta: dict) -> None:
        try:
            for kind, container in [("init", c) for c in spec.get("initContainers", [])] + [("main", c) for c in spec["containers"]]:
                if self._stop.is_set():
                    pod.error = pod.error or "stopped: another pod failed"
                    return
                run = self._run_container(container, spec, meta)
                pod.containers.append(run)
                if run.returncode != 0:
                    pod.error = f"container {run.name} exited with {run.returncode}"
                    self._halt()
                    return
        except PodSpecError as e:
            pod.error = f"CreateContainerConfigError: {e}"
            self._halt()

    def _run_container(self, c: dict, spec: dict, meta: dict) -> ContainerRun:
        mounts = self._mounts(c, spec["_volumes"])
        rewrite = _Rewriter(mounts, self.aliases)
        env = self._env(c, meta, rewrite)
        argv = [rewrite(_expand(a, env)) for a in c.get("command", []) + c.get("args", [])]
        if not argv:
            raise PodSpecError(f"container {c['name']} has no command (the executor cannot use an image's entry point)")
        pod_dir: Path = spec["_dir"]
        home = pod_dir / "home"
        home.mkdir(parents=True, exist_ok=True)
        path = os.pathsep.join([str(p) for p in self.bin_dirs] + [os.environ.get("PATH", "/usr/bin:/bin")])
        under_test = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
        proc_env = {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8", "TMPDIR": str(home), **under_test, **self.extra_env, **env}
        exe = shutil.which(argv[0], path=path)
        if exe is None:
            raise PodSpecError(f"container {c['name']}: command {argv[0]!r} not found in {path}")
        cwd = Path(rewrite(c["workingDir"])) if c.get("workingDir") else home
        cwd.mkdir(parents=True, exist_ok=True)
        run = ContainerRun(c["name"], argv, env)
        log = pod_dir / "logs" / f"{c['name']}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w+", encoding="utf-8") as out:
            proc = subprocess.Popen([exe, *argv[1:]], env=proc_env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            with self._lock:
                self._procs.append(proc)
            while proc.poll() is None:
                if self._stop.wait(0.2):
                    _kill(proc)
            out.seek(0)
            run.output = out.read()
        run.returncode = proc.returncode
        return run

    def _env(self, c: dict, meta: dict, rewrite: "_Rewriter") -> dict[str, str]:
        env: dict[str, str] = {}
        for src in c.get("envFrom", []):
            if "secretRef" in src:
                data = self.secrets.get(src["secretRef"]["name"])
                if data is None and not src["secretRef"].get("optional"):
                    raise PodSpecError(f"secret \"{src['secretRef']['name']}\" not found")
                env.update(data or {})
            elif "configMapRef" in src:
                env.update(self.configmaps.get(src["configMapRef"]["name"], {}))
        if self.indexed:
            env["JOB_COMPLETION_INDEX"] = meta["annotations"][COMPLETION_INDEX]
        for e in c.get("env", []):
            # a literal value may reference variables defined before it: $(VAR), as the kubelet expands them
            value = _expand(e["value"], env) if "value" in e else self._value(e, meta)
            if value is not None:
                env[e["name"]] = rewrite(value)
        return env

    def _value(self, e: dict, meta: dict) -> str | None:
        ref = e.get("valueFrom", {})
        if "secretKeyRef" in ref:
            return self._key(self.secrets, ref["secretKeyRef"], "secret")
        if "configMapKeyRef" in ref:
            return self._key(self.configmaps, ref["configMapKeyRef"], "configmap")
        if "fieldRef" in ref:
            path = ref["fieldRef"]["fieldPath"]
            m = _FIELD.match(path)
            if m:
                return meta[m.group(1)].get(m.group(2), "")
            simple = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1", "spec.nodeName": "localhost"}
            if path not in simple:
                raise PodSpecError(f"fieldRef {path} is not supported by the pod executor")
            return simple[path]
        raise PodSpecError(f"env {e['name']}: unsupported valueFrom {sorted(ref)}")

    @staticmethod
    def _key(store: dict, sel: dict, what: str) -> str | None:
        data = store.get(sel["name"])
        if data is None or sel["key"] not in data:
            if sel.get("optional"):
                return None
            missing = f'{what} "{sel["name"]}" not found' if data is None else f'couldn\'t find key {sel["key"]} in {what.capitalize()} {sel["name"]}'
            raise PodSpecError(missing)
        return data[sel["key"]]

    def _halt(self) -> None:
        self._stop.set()
        with self._lock:
            for p in self._procs:
                if p.poll() is None:
                    _kill(p)


class _Rewriter:
    """Maps pod paths to host paths (longest mount first, whole path segments only), DNS names and ports."""

    def __init__(self, mounts: dict[str, Path], aliases: dict[str, str]) -> None:
        self.mounts = mounts
        paths = sorted(mounts, key=len, reverse=True)
        self._paths = re.compile(r"(?<![\w./-])(" + "|".join(re.escape(p.rstrip("/")) for p in paths) + r")(?=/|$|[^\w.-])") if paths else None
        self.aliases = aliases

    def __call__(self, value: str) -> str:
        if self._paths is not None:
            value = self._paths.sub(lambda m: str(self.mounts.get(m.group(1)) or self.mounts[m.group(1) + "/"]), value)
        for old, new in self.aliases.items():  # whole values, or the value of --flag=VALUE
            if value == old:
                return new
            if value.endswith("=" + old):
                return value[: -len(old)] + new
        return value


def _expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion: defined variables are replaced, $$ escapes, unknown ones stay."""
    return _VAR.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 15)
        proc.wait(10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass

"""The Docker image, built and run for real: build time, image size, time to healthy, time to join.

Builds the base from Debian's packages (debootstrap bookworm + python3, the host's extra CA certificates; reused
unless --rebuild-base) and the project image with the local torch wheel, cold unless --cache. Then on a fresh docker
network: A runs the image's own CMD until its HEALTHCHECK is healthy; B joins it (`blocktrain join MULTIADDR --block
N`, no --data) until it merges a round with both peers and `blocktrain status --swarm` in A lists 2 peers; both are
stopped (`docker stop`, timed) and removed. Bounded by --timeout-s; needs root (starts dockerd when none runs).
Writes --out (benchmarks/results/docker_image.json) and prints a markdown table (BENCHMARKS.md#docker_image).

    python benchmarks/docker_image.py --rebuild-base
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import results

ROOT = Path(__file__).resolve().parent.parent
CONTEXT_FILES = ["Dockerfile", ".dockerignore", "pyproject.toml", "README.md"]
CONTEXT_DIRS = ["swarmd", "cli", "proto"]  # the Dockerfile's COPY sources
SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"  # the base image's Debian
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
JOIN_RE = re.compile(r"^join with: blocktrain join (\S+) --data FILE --swarm-id (\S+)", re.M)
BLOCK_RE = re.compile(r"^block: (\d+)", re.M)
ROUND_RE = re.compile(r"^round (\d+): block (\d+) train ce (\S+) participation ([\d.]+)", re.M)
MILESTONES = {  # what a container's poll looks for -> the table's words for it
    "ready": "`ready` line",
    "healthy": "HEALTHCHECK healthy",
    "first_round": "first merged round",
    "full_round": "a round with both peers (participation 1.00)",
}


class Failed(Exception):
    """A step of the run failed (the message says which and why)."""


def time_left(deadline: float) -> float:
    """Seconds to the run's deadline (--timeout-s), at least 1; Failed once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise Failed("out of --timeout-s")
    return max(1.0, left)


def sh(args: list[str], timeout: float, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """Run args (text output captured); Failed with the output's tail when it fails or times out."""
    try:
        res = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        raise Failed(f"{' '.join(args[:4])} ...: no result within {timeout:.0f}s") from e
    if check and res.returncode != 0:
        tail = (res.stdout + res.stderr).strip()[-2000:]
        raise Failed(f"{' '.join(args[:4])} ... exited {res.returncode}: {tail}")
    return res


def docker_ok() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def unavailable() -> str | None:
    """Why this benchmark cannot run here (None when it can): docker, root, a daemon or a way to start one."""
    if shutil.which("docker") is None:
        return "no docker client on PATH (Debian: apt-get install docker.io)"
    if os.geteuid() != 0:
        return "needs root (debootstrap, chroot and the docker socket)"
    if not docker_ok() and shutil.which("dockerd") is None:
        return "no docker daemon answers `docker info` and there is no dockerd to start"
    return None


def ensure_dockerd(wait_s: float = 60.0) -> bool:
    """A docker daemon that answers; started as `dockerd > /tmp/dockerd.log 2>&1 &` when none does (True then)."""
    if docker_ok():
        return False
    with open("/tmp/dockerd.log", "ab") as log:
        subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return wait_for("`docker info` from the dockerd started (see /tmp/dockerd.log)", docker_ok, None, wait_s, 1.0)


def image_size(tag: str, check: bool = True) -> int | None:
    """The image's bytes (None when there is no such image and not check)."""
    res = sh(["docker", "image", "inspect", "-f", "{{.Size}}", tag], 30, check=check)
    return int(res.stdout.strip()) if res.returncode == 0 else None


def build_base(tag: str, deadline: float) -> float:
    """debootstrap a minimal Debian with python3 + venv into a temporary folder, `docker import` it as tag; seconds."""
    if shutil.which("debootstrap") is None:
        raise Failed("no debootstrap (apt-get install debootstrap) to build the base image")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="blocktrain-rootfs-", dir="/var/tmp", ignore_cleanup_errors=True) as work:
        rootfs = Path(work) / "rootfs"
        include = "python3,python3-venv,ca-certificates"
        debootstrap = ["debootstrap", "--variant=minbase", f"--include={include}", SUITE, str(rootfs), MIRROR]
        sh(debootstrap, time_left(deadline))
        extra = sorted(glob.glob("/usr/local/share/ca-certificates/*.crt"))  # the TLS proxy the host trusts
        for crt in extra:
            shutil.copy2(crt, rootfs / "usr/local/share/ca-certificates" / Path(crt).name)
        if extra:
            sh(["chroot", str(rootfs), "update-ca-certificates"], time_left(deadline))
        for p in [*(rootfs / "var/cache/apt/archives").glob("*"), *(rootfs / "var/lib/apt/lists").glob("*")]:
            if p.is_file():
                p.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        try:
            changes = ["--change", f"ENV {PATH_ENV}", "--change", 'CMD ["/bin/bash"]']
            msg = f"debootstrap --variant=minbase {SUITE} +{include}" + (" + host CA certificates" if extra else "")
            sh(["docker", "import", *changes, "--message", msg, "-", tag], time_left(deadline), stdin=tar.stdout)
        finally:
            tar.stdout.close()
            tar.wait()
        return time.monotonic() - started


def stage_context(ctx: Path, wheel: Path | None) -> int:
    """The build context: the files the Dockerfile copies (no bytecode), wheels/ with the torch wheel; its bytes
    without the wheel."""
    for name in CONTEXT_FILES:
        shutil.copy2(ROOT / name, ctx / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache", ".ruff_cache")
    for name in CONTEXT_DIRS:
        shutil.copytree(ROOT / name, ctx / name, ignore=skip)
    size = sum(p.stat().st_size for p in ctx.rglob("*") if p.is_file())
    (ctx / "wheels").mkdir()
    if wheel is not None:
        try:
            os.link(wheel, ctx / "wheels" / wheel.name)  # same file system: no 200 MB copy
        except OSError:
            shutil.copy2(wheel, ctx / "wheels" / wheel.name)
    return size


def docker_build(args: list[str], deadline: float, log_path: Path) -> float:
    """Run one `docker build` (its output to log_path); its seconds."""
    started = time.monotonic()
    with open(log_path, "w") as log:
        try:
            res = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT, timeout=time_left(deadline))
        except subprocess.TimeoutExpired as e:
            raise Failed(f"docker build ran past the budget (log: {log_path})") from e
    if res.returncode != 0:
        raise Failed(f"docker build exited {res.returncode} (log: {log_path}):\n{log_path.read_text()[-3000:]}")
    return time.monotonic() - started


def layers(tag: str) -> list[dict]:
    """The image's layers that hold bytes, top first: size and the instruction that made it."""
    res = sh(["docker", "history", "--no-trunc", "--format", "{{json .}}", tag], 30)
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    sized = [r for r in rows if r.get("Size") not in ("0B", "0")]
    return [{"size": r.get("Size"), "created_by": r.get("CreatedBy", "")[:160]} for r in sized]


def build_image(a, deadline: float, log_path: Path) -> dict:
    """The project image from a staged context: cold (--no-cache unless --cache); then, unless
    --no-rebuild, the rebuild a change of the code costs (one line appended to cli/__init__.py,
    layer cache on, tagged IMAGE-rebuild and removed again)."""
    with tempfile.TemporaryDirectory(prefix="blocktrain-ctx-", dir="/var/tmp") as tmp:
        ctx = Path(tmp)
        context_bytes = stage_context(ctx, a.torch_wheel)
        args = ["docker", "build", "--build-arg", f"BASE_IMAGE={a.base_tag}"]
        if a.torch_wheel is not None:
            args += ["--build-arg", "TORCH_INDEX=", "--build-arg", "TORCH_WHEELS=wheels"]
        cold = [*args, "-t", a.image_tag, *([] if a.cache else ["--no-cache"])]
        out = {"build_s": round(docker_build([*cold, str(ctx)], deadline, log_path), 1)}
        out.update(context_bytes_without_wheel=context_bytes, build_command=cold)
        if a.rebuild:
            with open(ctx / "cli" / "__init__.py", "a") as f:
                f.write("# a change of the code\n")
            tag = f"{a.image_tag}-rebuild"
            seconds = docker_build([*args, "-t", tag, str(ctx)], deadline, log_path.with_suffix(".rebuild.log"))
            out["rebuild_after_code_change_s"] = round(seconds, 1)
            with contextlib.suppress(Failed):  # slow under load (its own copy of the venv layer): never fatal
                sh(["docker", "rmi", tag], 300, check=False)
    return out


def state(name: str) -> dict:
    return json.loads(sh(["docker", "inspect", "-f", "{{json .State}}", name], 30).stdout)


def logs(name: str, stderr: bool = True) -> str:
    """A container's output: its stdout, then (stderr) its stderr."""
    res = sh(["docker", "logs", name], 30, check=False)
    return res.stdout + (res.stderr if stderr else "")


def wait_for(what: str, probe, deadline: float | None, limit_s: float, every_s: float = 0.5):
    """Poll probe() (returns a truthy value when done) until it is done, limit_s or the run's deadline run out."""
    give_up = time.monotonic() + limit_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > give_up:
            raise Failed(f"timed out after {limit_s:.0f}s waiting for {what}")
        if deadline is not None:
            time_left(deadline)
        time.sleep(every_s)


def train_text(path: Path, size: int = 256 << 10) -> None:
    """A small deterministic English-like text for container A (mounted at /data/train.txt)."""
    words = "the swarm trains one block of a byte level model and merges its deltas with its peers each round"
    words = words.split(" ")
    lines, n, i = [], 0, 0
    while n < size:
        line = " ".join(words[(i * 7 + k * 3) % len(words)] for k in range(12)) + f" ({i})."
        lines.append(line)
        n += len(line) + 1
        i += 1
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o644)


def docker_run(name: str, net: str, a, extra: list[str], cmd: list[str]) -> None:
    health = ["--health-interval", f"{a.health_interval_s}s", "--health-start-period", f"{a.health_start_s}s"]
    limits = ["--cpus", str(a.cpus)] if a.cpus else []
    env = ["-e", "OMP_NUM_THREADS=1", "-e", "MKL_NUM_THREADS=1"]
    sh(["docker", "run", "-d", "--name", name, "--network", net, *health, *limits, *env, *extra, a.image_tag, *cmd], 60)


def two_peers(container: str, multiaddr: str, swarm_id: str) -> dict | None:
    """`blocktrain status --swarm --json` run in container, once it lists 2 peers (else None)."""
    cmd = ["blocktrain", "status", "--swarm", multiaddr, "--swarm-id", swarm_id, "--json", "--timeout-s", "10"]
    res = sh(["docker", "exec", container, *cmd], 90, check=False)
    with contextlib.suppress(json.JSONDecodeError):
        summary = json.loads(res.stdout) if res.returncode == 0 else None
        return summary if summary and len(summary.get("peers", [])) >= 2 else None
    return None


def round_line(match: tuple[str, ...]) -> dict:
    """A `round R: block B train ce X participation P` line's numbers."""
    kinds = {"round": int, "block": int, "train_ce": float, "participation": float}
    return {k: kind(v) for (k, kind), v in zip(kinds.items(), match)}


class Watch:
    """One container's MILESTONES, each timed from its `docker run` the first time a poll sees it."""

    def __init__(self, name: str):
        self.name, self.started, self.seen = name, time.monotonic(), {}

    def poll(self) -> str:
        st = state(self.name)
        if st.get("Status") != "running":
            status = f"{st.get('Status')} (exit {st.get('ExitCode')})"
            raise Failed(f"container {self.name} is {status}:\n{logs(self.name)[-3000:]}")
        text = logs(self.name, stderr=False)
        now = round(time.monotonic() - self.started, 1)
        rounds = ROUND_RE.findall(text)
        happened = {
            "ready": "\nready" in "\n" + text,
            "healthy": st.get("Health", {}).get("Status") == "healthy",
            "first_round": bool(rounds),
            "full_round": any(float(r[3]) >= 0.99 for r in rounds),
        }
        for key in (k for k, yes in happened.items() if yes):
            self.seen.setdefault(key, now)
        return text

    def until(self, keys: list[str], deadline: float, limit_s: float) -> str:
        """Its output once every one of keys was seen."""
        done = lambda: (text := self.poll()) and all(k in self.seen for k in keys) and text
        return wait_for(f"{self.name}: " + ", ".join(MILESTONES[k] for k in keys), done, deadline, limit_s)


def run_swarm(a, deadline: float, out: dict, workdir: Path) -> None:
    """Containers A and B on a fresh network, their milestones and `docker stop` into out; always cleaned up."""
    tag = f"{os.getpid()}"
    net, ca, cb = f"blocktrain-bench-{tag}", f"blocktrain-a-{tag}", f"blocktrain-b-{tag}"
    data = workdir / "train.txt"
    train_text(data)
    created: list[str] = []
    watches: dict[str, Watch] = {}
    try:
        sh(["docker", "network", "create", net], 30)
        created.append("network")
        wa = watches["a"] = Watch(ca)
        docker_run(ca, net, a, ["-v", f"{data}:/data/train.txt:ro"], [])  # the image's own CMD
        created.append(ca)
        text = wa.until(["ready", "healthy"], deadline, a.wait_s)
        out["a_ready_s"], out["a_healthy_s"] = wa.seen["ready"], wa.seen["healthy"]
        join, block = JOIN_RE.search(text), BLOCK_RE.search(text)
        if not join or not block:
            raise Failed(f"no `join with:` / `block:` line in A's output:\n{text[-2000:]}")
        multiaddr, swarm_id, block_index = join.group(1), join.group(2), int(block.group(1))
        out.update(a_multiaddr=multiaddr, swarm_id=swarm_id, block=block_index)

        listen = ["--listen", "0.0.0.0:50051", "--dht-host", "0.0.0.0", "--dht-port", "31337"]
        b_cmd = ["join", multiaddr, "--swarm-id", swarm_id, "--block", str(block_index), *listen]
        b_cmd += ["--checkpoint-dir", "/data/checkpoint"]
        wb = watches["b"] = Watch(cb)
        docker_run(cb, net, a, [], b_cmd)
        created.append(cb)
        out["b_command"] = ["docker", "run", "...", a.image_tag, *b_cmd]
        text = wb.until(list(MILESTONES), deadline, a.wait_s)
        out.update({f"b_{k}_s": wb.seen[k] for k in MILESTONES})
        rounds = ROUND_RE.findall(text)
        out["b_first_round"] = round_line(rounds[0])
        out["b_merged_round"] = round_line(next(r for r in rounds if float(r[3]) >= 0.99))
        out["b_corpus"] = next((ln for ln in logs(cb).splitlines() if ln.startswith("data: ")), None)

        listed = lambda: two_peers(ca, multiaddr, swarm_id)
        summary = wait_for("A's `blocktrain status --swarm` listing 2 peers", listed, deadline, a.wait_s, 2.0)
        keys = ("peer_id", "block", "round", "state", "participation", "address")
        out["status_peers"] = [{k: p.get(k) for k in keys} for p in summary["peers"]]
    finally:
        out["milestones_s"] = {k: w.seen for k, w in watches.items()}  # what each reached, also on a failure
        out["stop"] = {}
        for key, name in (("b", cb), ("a", ca)):
            if name in created:
                with contextlib.suppress(Failed, subprocess.TimeoutExpired, OSError):
                    out["stop"][key] = stop(name, a.stop_timeout_s)
                subprocess.run(["docker", "rm", "-f", "-v", name], capture_output=True, timeout=60)
        if "network" in created:
            subprocess.run(["docker", "network", "rm", net], capture_output=True, timeout=60)


def _utc(stamp: str) -> float:
    """Docker's RFC 3339 nanosecond timestamp as POSIX seconds."""
    day, _, frac = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(day).replace(tzinfo=UTC).timestamp() + float(f"0.{frac or 0}")


def stop(name: str, timeout_s: float) -> dict:
    """`docker stop -t timeout_s` (SIGTERM, SIGKILL after timeout_s): seconds to the daemon's `stopped at`
    line and to the container's exit (both from docker's clock), exit code (137: killed), last line."""
    sent = time.time()
    subprocess.run(["docker", "stop", "-t", str(int(timeout_s)), name], capture_output=True, timeout=timeout_s + 60)
    st = state(name)
    stamped = sh(["docker", "logs", "-t", name], 30, check=False)
    stopped_at = next((ln.split(" ", 1)[0] for ln in stamped.stdout.splitlines() if " stopped at round " in ln), None)
    lines = logs(name, stderr=False).strip().splitlines()
    return {
        "to_stopped_line_s": round(_utc(stopped_at) - sent, 1) if stopped_at else None,
        "to_exit_s": round(_utc(st["FinishedAt"]) - sent, 1),
        "exit_code": st.get("ExitCode"),
        "last_line": lines[-1] if lines else None,
        "stderr_after_sigterm": [  # what the daemon logged while it stopped, with docker's timestamps
            ln[:300] for ln in stamped.stderr.splitlines() if _utc(ln.split(" ", 1)[0]) >= sent
        ][-5:],
    }


def default_wheel() -> Path | None:
    env = os.environ.get("BLOCKTRAIN_TORCH_WHEEL")
    found = [env] if env else sorted(glob.glob("/opt/wheels/torch-*-cp311-cp311-*x86_64.whl"))
    return Path(found[-1]) if found else None


def table(r: dict) -> list[str]:
    """The result as a markdown table, "-" for what the run did not get to."""
    fig = lambda key: "-" if r.get(key) is None else f"{r[key]} s"
    mib = lambda key: f"{r[key] / (1 << 20):.0f} MiB" if r.get(key) else "-"

    def stops(key: str, code: bool = False) -> str:
        parts = []
        for st in (r.get("stop", {}).get(k) or {} for k in ("a", "b")):
            v = "-" if st.get(key) is None else f"{st[key]} s"
            parts.append(f"{v} ({st.get('exit_code', '-')})" if code else v)
        return " / ".join(parts)

    base = f"{mib('base_size_bytes')}, built in {'cached' if r.get('base_cached') else fig('base_build_s')}"
    cold = "(layer cache on)" if r.get("cache") else "(--no-cache: cold)"
    peers = str(len(r["status_peers"])) if "status_peers" in r else "-"
    rows = [
        ("base image (debootstrap bookworm + python3, `docker import`)", base),
        ("project image (`docker image inspect` Size)", mib("image_size_bytes")),
        (f"build time, project layers {cold}", fig("build_s")),
        ("rebuild after a change of the code (layer cache on)", fig("rebuild_after_code_change_s")),
        *((f"A: `docker run` -> {MILESTONES[k]}", fig(f"a_{k}_s")) for k in ("ready", "healthy")),
        *((f"B: `docker run ... join` -> {what}", fig(f"b_{k}_s")) for k, what in MILESTONES.items()),
        ("peers listed by `blocktrain status --swarm` in A", peers),
        ("`docker stop` (SIGTERM) -> `stopped at` line, A / B", stops("to_stopped_line_s")),
        ("`docker stop` (SIGTERM) -> exit (exit code), A / B", stops("to_exit_s", True)),
    ]
    return results.table("step | figure", (f"{k} | {v}" for k, v in rows))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--timeout-s", type=float, default=1800.0, help="bound on the whole run, seconds")
    p.add_argument("--base-tag", default="blocktrain-base:bookworm", help="the debootstrap base image's tag")
    p.add_argument("--rebuild-base", action="store_true", help="rebuild the base even if --base-tag exists")
    p.add_argument("--image-tag", default="blocktrain:local")
    wheel = "a local torch wheel (default: $BLOCKTRAIN_TORCH_WHEEL, else /opt/wheels/torch-*cp311*.whl)"
    p.add_argument("--torch-wheel", type=Path, default=default_wheel(), help=wheel)
    p.add_argument("--cache", action="store_true", help="let docker build use its layer cache (not a cold build)")
    p.add_argument("--no-rebuild", dest="rebuild", action="store_false", help="skip the rebuild after a code change")
    p.add_argument("--skip-build", action="store_true", help="run the containers on an existing --image-tag")
    p.add_argument("--health-interval-s", type=float, default=2.0, help="docker run --health-interval (image: 30s)")
    p.add_argument("--health-start-s", type=float, default=120.0, help="docker run --health-start-period")
    p.add_argument("--cpus", type=float, default=1.0, help="docker run --cpus per container (0: no limit)")
    p.add_argument("--stop-timeout-s", type=float, default=30.0, help="docker stop -t (docker's default: 10)")
    p.add_argument("--wait-s", type=float, default=600.0, help="the longest one wait (healthy, a round, ...) may take")
    p.add_argument("--out", type=Path, default=ROOT / results.RESULTS / "docker_image.json")
    p.add_argument("--build-log", type=Path, default=Path("/tmp/blocktrain-docker-build.log"))
    a = p.parse_args(argv)
    if a.torch_wheel is not None and not a.torch_wheel.is_file():
        p.error(f"--torch-wheel {a.torch_wheel}: no such file")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    why = unavailable()
    if why:
        print(f"docker_image.py: cannot run here: {why}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + a.timeout_s
    r: dict = {
        "command": "python benchmarks/docker_image.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "base_tag": a.base_tag,
        "image_tag": a.image_tag,
        "torch_wheel": str(a.torch_wheel) if a.torch_wheel else None,
        "cache": a.cache,
        "ok": False,
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
    }
    started = time.monotonic()
    try:
        r["started_dockerd"] = ensure_dockerd()
        r["docker"] = sh(["docker", "version", "-f", "{{.Server.Version}}"], 30).stdout.strip()
        r["base_cached"] = image_size(a.base_tag, check=False) is not None and not a.rebuild_base
        if not r["base_cached"]:
            r["base_build_s"] = round(build_base(a.base_tag, deadline), 1)
        r["base_size_bytes"] = image_size(a.base_tag)
        if not a.skip_build:
            r.update(build_image(a, deadline, a.build_log))
        r["image_size_bytes"] = image_size(a.image_tag)
        r["layers"] = layers(a.image_tag)
        r["python"] = sh(["docker", "run", "--rm", "--entrypoint", "python3", a.image_tag, "-V"], 60).stdout.strip()
        with tempfile.TemporaryDirectory(prefix="blocktrain-docker-") as tmp:
            run_swarm(a, deadline, r, Path(tmp))
        r["ok"] = True
    except Failed as e:
        r["error"] = str(e)
    r["total_s"] = round(time.monotonic() - started, 1)
    r["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    results.write_json(a.out, r, sort_keys=False)
    print("\n".join(table(r)))
    print(f"-> {a.out}" + ("" if r["ok"] else f"\nFAILED: {r['error']}"))
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

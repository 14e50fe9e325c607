"""python -m dfa: the `dfa` command's status, workers and cluster subcommands, on the package's
extension (so they work wherever `pip install client/python` does, without the C++ build tree).

    python -m dfa status  --coordinator HOST:PORT [--job ID] [--json]
    python -m dfa workers --coordinator HOST:PORT [--json]
    python -m dfa cluster [--workers N] [--threads T] [--backend B] [--memory-limit 8G]
                          [--bin-dir DIR] [--log-dir DIR]
    python -m dfa bench [--offload] [flags]   (dfa/bench.py; --offload: dfa/offload_bench.py)
    python -m dfa --version | -h

--json prints one JSON document with the keys of `dfa status --json` / `dfa workers --json`
(docs/client.md). Security flags as the `dfa` command's: --tls-cert --tls-key --tls-ca
--tls-server-name --auth-token (default $DFA_AUTH_TOKEN) --auth-token-file. An unknown flag or
command is named with the closest known one. Exit status: 0 success, 1 failure, 2 bad usage, 130 Ctrl-C.
"""

import argparse
import difflib
import json
import os
import re
import sys
import time

COMMANDS = ("status", "workers", "cluster", "bench")
_UNITS = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}


def parse_size(text):
    """'16K' -> 16384, '8G', '123': a count with an optional binary K/M/G/T suffix (as the dfa
    command's ParseCount)."""
    m = re.fullmatch(r"([0-9]+)([KMGTkmgt]?)", text)
    if not m:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not an integer (a count, optionally with K, M, G or T: 16K)")
    return int(m.group(1)) << _UNITS[m.group(2).upper()]


class UsageError(Exception):
    """Bad usage found after parsing (exit 2)."""


def version():
    try:
        from importlib.metadata import version as dist_version
        v = dist_version("dfa-client")
    except Exception:  # not installed as a distribution (a build tree's staged package)
        v = "unknown"
    return f"python -m dfa {v} (dfa-client)"


class Parser(argparse.ArgumentParser):
    """argparse with exit status 2 and "did you mean" for unknown flags."""

    def __init__(self, *a, **kw):
        kw.setdefault("allow_abbrev", False)
        super().__init__(*a, **kw)

    def parse_args(self, args=None, namespace=None):
        ns, unknown = self.parse_known_args(args, namespace)
        if unknown:
            parser, actions = self, list(self._actions)
            for act in self._actions:  # the chosen subcommand's flags and name
                if isinstance(act, argparse._SubParsersAction) and getattr(ns, act.dest, None):
                    parser = act.choices[getattr(ns, act.dest)]
                    actions += parser._actions
            known = [s for act in actions for s in act.option_strings if s.startswith("--")]
            flags = [w.split("=", 1)[0] for w in unknown if w.startswith("-")]
            errors = []
            for flag in flags:
                close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
                errors.append(f"unknown flag {flag}" +
                              (f" (did you mean {close[0]}?)" if close else ""))
            if not errors:
                errors = [f"unexpected argument '{unknown[0]}'"]
            parser.error("; ".join(errors))
        return ns

    def error(self, message):
        sys.stderr.write(f"{self.prog}: {message}\n({self.prog} --help lists its flags)\n")
        sys.exit(2)


def add_security(p):
    g = p.add_argument_group("security (docs/security.md)")
    g.add_argument("--tls-cert", default="", metavar="FILE", help="client certificate (PEM)")
    g.add_argument("--tls-key", default="", metavar="FILE", help="its private key (PEM)")
    g.add_argument("--tls-ca", default="", metavar="FILE", help="CA bundle of the servers")
    g.add_argument("--tls-server-name", default="", metavar="NAME",
                   help="name to expect in the servers' certificates")
    g.add_argument("--auth-token", default=None,
                   metavar="TOKEN", help="bearer token (default $DFA_AUTH_TOKEN)")
    g.add_argument("--auth-token-file", default="", metavar="FILE",
                   help="file holding the bearer token (instead of --auth-token)")


def auth_token(a):
    """The token of --auth-token, of --auth-token-file (trailing whitespace dropped), or of
    $DFA_AUTH_TOKEN, in that order; a usage error naming the flag for a bad file."""
    if a.auth_token_file:
        if a.auth_token is not None:
            raise UsageError("--auth-token and --auth-token-file: give one")
        try:
            with open(a.auth_token_file) as f:
                token = f.read().rstrip()
        except OSError as e:
            raise UsageError(f"--auth-token-file: cannot read '{a.auth_token_file}': "
                             f"{e.strerror}")
        if not token:
            raise UsageError(f"--auth-token-file: '{a.auth_token_file}' holds no token")
        return token
    if a.auth_token is not None:
        return a.auth_token
    return os.environ.get("DFA_AUTH_TOKEN", "")


def connect(a):
    import dfa
    if not a.coordinator:
        raise UsageError("--coordinator HOST:PORT is required")
    return dfa.Client(a.coordinator, token=auth_token(a), tls_cert=a.tls_cert, tls_key=a.tls_key,
                      tls_ca=a.tls_ca, tls_server_name=a.tls_server_name)


def cmd_status(a):
    client = connect(a)
    if a.job:
        job = client.get_job(a.job)
        if a.json:
            print(json.dumps(job))
        else:
            print(f"job {job['job_id']} (session {job['session_id']}): {job['kind']}, "
                  f"{job['state']}, {job['steps_done']}/{job['steps_total']} steps")
        return 0
    s = dict(coordinator=a.coordinator, **client.status())
    if a.json:
        print(json.dumps(s))
        return 0
    print(f"coordinator {a.coordinator}")
    print(f"  live workers   {s['live_workers']}\n  sessions       {s['sessions']}\n"
          f"  jobs running   {s['jobs_running']}\n  jobs queued    {s['jobs_queued']}\n"
          f"  memory         {s['memory_used_bytes'] / 2**20:.1f} / "
          f"{s['memory_limit_bytes'] / 2**20:.1f} MiB")
    return 0


def cmd_workers(a):
    workers = connect(a).list_workers()
    if a.json:
        print(json.dumps({"coordinator": a.coordinator, "workers": workers}))
        return 0
    print(f"{'WORKER':16} {'ADDRESS':22} {'HOST':12} {'BACKEND':7} {'DEVICE':10} {'SPEED':>8} "
          f"{'MEMORY USED/LIMIT MiB':>22} {'LAST SEEN':>10}")
    for w in workers:
        mem = f"{w['memory_used_bytes'] / 2**20:.1f}/{w['memory_limit_bytes'] / 2**20:.1f}"
        print(f"{w['worker_id']:16} {w['address']:22} {w['host']:12} {w['backend']:7} "
              f"{w['device']:10} {w['speed']:8.2f} {mem:>22} {w['last_seen_seconds']:9.2f}s"
              + ("" if w["alive"] else "  (lost)"))
    print(f"{len(workers)} worker(s)")
    return 0


def cmd_cluster(a):
    import dfa
    c = dfa.LocalCluster(workers=a.workers, threads_per_worker=a.threads, backend=a.backend,
                         memory_limit_bytes=a.memory_limit, bin_dir=a.bin_dir,
                         log_dir=a.log_dir or "")
    try:
        print(f"coordinator  {c.coordinator_address}")
        for i, w in enumerate(c.worker_addresses):
            print(f"worker-{i}     {w}")
        print(f"{c.workers} {c.backend} worker(s), {c.threads_per_worker} thread(s) each; logs in "
              f"{c.log_dir}\ntry: dfa demo --coordinator {c.coordinator_address}   "
              f"(Ctrl-C stops the cluster)", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        c.stop(check=False)
        print("stopped", flush=True)
    return 0


def build_parser():
    p = Parser(prog="python -m dfa",
               description="The dfa command's status, workers and cluster on the Python "
                           "package (docs/python.md).")
    p.add_argument("--version", action="version", version=version())
    sub = p.add_subparsers(dest="command", metavar="{status,workers,cluster}",
                           parser_class=Parser)
    s = sub.add_parser("status", prog="python -m dfa status",
                       help="cluster summary, or one job (--job ID)")
    s.add_argument("--coordinator", default="", metavar="HOST:PORT", help="(required)")
    s.add_argument("--job", default="", metavar="JOB_ID", help="one job instead of the summary")
    s.add_argument("--json", action="store_true", help="one JSON document (docs/client.md)")
    add_security(s)
    s.add_argument("--version", action="version", version=version())
    s.set_defaults(run=cmd_status)
    w = sub.add_parser("workers", prog="python -m dfa workers", help="the registered workers")
    w.add_argument("--coordinator", default="", metavar="HOST:PORT", help="(required)")
    w.add_argument("--json", action="store_true", help="one JSON document (docs/client.md)")
    add_security(w)
    w.add_argument("--version", action="version", version=version())
    w.set_defaults(run=cmd_workers)
    c = sub.add_parser("cluster", prog="python -m dfa cluster",
                       help="a coordinator and N workers on loopback until Ctrl-C "
                            "(the defaults of `dfa cluster`)")
    c.add_argument("--workers", type=parse_size, default=None, metavar="N")
    c.add_argument("--threads", type=parse_size, default=None, metavar="T",
                   help="threads per worker (0: the worker's default)")
    c.add_argument("--backend", default=None, metavar="B")
    c.add_argument("--memory-limit", type=parse_size, default=None, metavar="BYTES",
                   help="per worker, e.g. 8G")
    c.add_argument("--bin-dir", default=None, metavar="DIR",
                   help="the build folder with the daemons (default $DFA_BIN_DIR)")
    c.add_argument("--log-dir", default=None, metavar="DIR")
    c.add_argument("--version", action="version", version=version())
    c.set_defaults(run=cmd_cluster)
    return p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "bench":  # its own flags (python -m dfa bench --help)
        from dfa import bench
        return bench.main(argv[1:]) or 0
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        close = difflib.get_close_matches(argv[0], COMMANDS, n=1, cutoff=0.6)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        sys.stderr.write(f"python -m dfa: unknown command '{argv[0]}'{hint}; commands: "
                         f"{', '.join(COMMANDS)}\n")
        return 2
    p = build_parser()
    a = p.parse_args(argv)
    if not getattr(a, "command", None):
        p.print_help(sys.stderr)
        return 2
    from dfa.errors import DfaError, InvalidArgumentError
    try:
        return a.run(a)
    except UsageError as e:
        sys.stderr.write(f"python -m dfa {a.command}: {e}\n")
        return 2
    except InvalidArgumentError as e:
        sys.stderr.write(f"python -m dfa {a.command}: {e}\n")
        return 2
    except DfaError as e:
        sys.stderr.write(f"python -m dfa {a.command}: {e}\n")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""What the multi-process Python integration tests share: counted checks, a log line, and
processes by pid (alive, waited for, killed)."""
import os
import signal
import time

failures = []
checks = 0


def check(cond, what):
    """Counts a check; a false `cond` is a failure named `what`. Returns cond."""
    global checks
    checks += 1
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)
    return cond


def summary(name):
    """Prints the count and returns the exit status: 1 on a failure or when nothing was checked."""
    print(f"{name}: {checks} checks, {len(failures)} failures")
    return 1 if failures or checks == 0 else 0


def log(msg):
    print(msg, flush=True)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(pred, timeout, step=0.1):
    """pred()'s first true value within `timeout` seconds, else its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


def kill_left(pids):
    """SIGKILL whatever of `pids` still runs (daemons live in their own process groups)."""
    for p in pids:
        if alive(p):
            os.kill(p, signal.SIGKILL)

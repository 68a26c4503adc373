#!/usr/bin/env python3
"""Runs a command under an OCI seccomp profile (the JSON a container runtime
loads for seccompProfile: Localhost), as runc would install it, through
libseccomp's Python binding:

  seccomp_exec.py PROFILE.json [--deny NAME,NAME] -- COMMAND ARGS...

--deny removes syscalls from the profile's allowlist first (e.g. io_uring's,
as containerd 2 and Docker 25's default profiles do). Syscall names unknown on
this architecture are skipped, as runc skips them.
"""
import errno
import json
import os
import sys

import seccomp


def action(name: str, errno_ret: int):
    if name == "SCMP_ACT_ALLOW":
        return seccomp.ALLOW
    if name == "SCMP_ACT_ERRNO":
        return seccomp.ERRNO(errno_ret)
    if name in ("SCMP_ACT_KILL", "SCMP_ACT_KILL_THREAD"):
        return seccomp.KILL
    if name == "SCMP_ACT_KILL_PROCESS":
        return seccomp.KILL_PROCESS
    if name == "SCMP_ACT_LOG":
        return seccomp.LOG
    raise SystemExit(f"seccomp_exec: unsupported action {name}")


def main(argv) -> int:
    if "--" not in argv or len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    sep = argv.index("--")
    opts, command = argv[1:sep], argv[sep + 1:]
    profile = json.load(open(opts[0]))
    deny = set()
    if len(opts) == 3 and opts[1] == "--deny":
        deny = set(opts[2].split(","))
    default_errno = profile.get("defaultErrnoRet", errno.EPERM)
    f = seccomp.SyscallFilter(defaction=action(profile["defaultAction"], default_errno))
    for rule in profile["syscalls"]:
        if rule.get("args"):
            raise SystemExit("seccomp_exec: argument conditions are not supported")
        act = action(rule["action"], rule.get("errnoRet", default_errno))
        for name in rule["names"]:
            if name in deny:
                continue
            try:
                f.add_rule(act, name)
            except (RuntimeError, ValueError):
                pass  # not a syscall of this architecture
    f.load()
    os.execvp(command[0], command)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv))

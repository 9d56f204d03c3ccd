"""A multi-host test bed on one machine: N network namespaces ("hosts") on a
bridge, each with its own address in a private subnet, its own host name, /etc/hosts
and /dev/shm, and Debian's sshd on a port the bed chose, reachable with a key the
bed made. Needs root, iproute2 and openssh-server.

    with TestBed(2) as bed:                      # hosts node1, node2
        bed.run("node1", ["chorusrun", "-H", "node1:2,node2:2", ...])
        bed.link("node2", up=False)              # a link fault
        bed.loss("node2", 3); bed.rate("node2", 100)   # lossy, slow links (no delay: no netem)

Everything is removed on exit, also after a failure, and beds left behind by a
killed test run are removed by the next one. From a shell (for trying by hand):
    python3 tests/multihost/testbed.py up 2      # prints how to reach the hosts
    python3 tests/multihost/testbed.py down
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PREFIX = "chb"  # namespace and link names: chb<bed>-node<i>, chb<bed>b (bridge), chb<bed>v<i>
STATE = "/run/chorus-testbed"  # one JSON file per live bed: what to remove


def _sh(*args, check=True, **kw):
    return subprocess.run(list(args), check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def unavailable():
    """Why namespace hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "the multi-host test bed needs root (network namespaces)"
    for tool in ("ip", "unshare", "nsenter", "ssh", "ssh-keygen"):
        if not shutil.which(tool):
            return f"the multi-host test bed needs '{tool}'"
    if not os.path.exists("/usr/sbin/sshd"):
        return "the multi-host test bed needs Debian's openssh-server (/usr/sbin/sshd)"
    probe = f"{PREFIX}probe{os.getpid()}"
    r = _sh("ip", "netns", "add", probe, check=False)
    if r.returncode != 0:
        return "network namespaces cannot be created here: " + r.stderr.strip()
    _sh("ip", "netns", "del", probe, check=False)
    return None


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _remove(state):
    """Kills everything in the bed's namespaces and removes them, the links and the files."""
    for ns in state.get("namespaces", []):
        pids = _sh("ip", "netns", "pids", ns, check=False).stdout.split()
        for p in pids:
            try:
                os.kill(int(p), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for pid in state.get("sshd", []):  # the mount/UTS holders, in case they left the netns
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.time() + 5
    for ns in state.get("namespaces", []):
        while _sh("ip", "netns", "pids", ns, check=False).stdout.strip() and time.time() < deadline:
            time.sleep(0.05)
        _sh("ip", "netns", "del", ns, check=False)
    for link in state.get("links", []):
        _sh("ip", "link", "del", link, check=False)
    if state.get("workdir"):
        shutil.rmtree(state["workdir"], ignore_errors=True)


def sweep():
    """Removes beds whose creating process is gone (a test run that was killed)."""
    if not os.path.isdir(STATE):
        return
    for name in os.listdir(STATE):
        path = os.path.join(STATE, name)
        try:
            state = json.load(open(path))
        except (OSError, ValueError):
            os.unlink(path)
            continue
        if not _alive(state["owner"]):
            _remove(state)
            os.unlink(path)


class TestBed:
    def __init__(self, hosts=2, port=2222):
        self.n = hosts
        self.port = port
        self.bed = None
        self.names = [f"node{i + 1}" for i in range(hosts)]
        self.state = {}

    # The subnet is 10.<200 + bed // 250>.<bed % 250>.0/24, the bed's number taken
    # from the first free slot, so that beds of parallel runs never share one.
    def _claim(self):
        os.makedirs(STATE, exist_ok=True)
        for bed in range(1, 1000):
            path = os.path.join(STATE, f"{bed}.json")
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                continue
            os.close(fd)
            return bed, path
        raise RuntimeError("no free test-bed number")

    def address(self, host):
        i = self.names.index(host)
        return f"10.{200 + self.bed // 250}.{self.bed % 250}.{11 + i}"

    def _save(self):
        with open(self.state_path + ".tmp", "w") as f:
            json.dump(self.state, f)
        os.replace(self.state_path + ".tmp", self.state_path)

    def __enter__(self):
        why = unavailable()
        if why:
            raise RuntimeError(why)
        sweep()
        self.bed, self.state_path = self._claim()
        self.work = tempfile.mkdtemp(prefix=f"chorus-bed{self.bed}-")
        self.state = {"owner": os.getpid(), "namespaces": [], "links": [], "sshd": [], "workdir": self.work}
        self._save()
        try:
            self._build()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _build(self):
        w = self.work
        self.key = os.path.join(w, "client_key")
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.key)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(w, "host_key"))
        shutil.copy(self.key + ".pub", os.path.join(w, "authorized_keys"))
        with open(os.path.join(w, "hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n")
            for h in self.names:
                f.write(f"{self.address(h)} {h}\n")
        with open(os.path.join(w, "sshd_config"), "w") as f:
            f.write(f"Port {self.port}\nHostKey {w}/host_key\nAuthorizedKeysFile {w}/authorized_keys\n"
                    "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                    "UsePAM no\nStrictModes no\nPrintMotd no\nPrintLastLog no\nLogLevel ERROR\n"
                    "MaxStartups 100:30:200\nMaxSessions 100\n")
        # For programs that take an ssh command (Open MPI's plm_rsh_agent): ssh -F this.
        self.ssh_config = os.path.join(w, "ssh_config")
        with open(self.ssh_config, "w") as f:
            f.write(f"Host {' '.join(self.names)}\n  Port {self.port}\n  IdentityFile {self.key}\n"
                    "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  BatchMode yes\n  LogLevel ERROR\n")
        bridge = f"{PREFIX}{self.bed}b"
        _sh("ip", "link", "add", bridge, "type", "bridge")
        self.state["links"].append(bridge)
        self._save()
        _sh("ip", "link", "set", bridge, "up")
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
        self.sshd = {}
        for i, h in enumerate(self.names):
            ns, veth = f"{PREFIX}{self.bed}-{h}", f"{PREFIX}{self.bed}v{i + 1}"
            _sh("ip", "netns", "add", ns)
            self.state["namespaces"].append(ns)
            _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self.state["links"].append(veth)
            self._save()
            _sh("ip", "link", "set", veth, "master", bridge)
            _sh("ip", "link", "set", veth, "up")
            for cmd in (["ip", "addr", "add", f"{self.address(h)}/24", "dev", "eth0"],
                        ["ip", "link", "set", "eth0", "up"], ["ip", "link", "set", "lo", "up"]):
                _sh("ip", "netns", "exec", ns, *cmd)
            # Its own host name, /etc/hosts and /dev/shm, as a real host has; sshd's
            # sessions (and so the ranks started over ssh) inherit them.
            setup = (f"mount --make-rprivate / && mount --bind {w}/hosts /etc/hosts && "
                     f"mount -t tmpfs -o size=2g tmpfs /dev/shm && hostname {h} && "
                     f"exec /usr/sbin/sshd -D -e -f {w}/sshd_config")
            proc = subprocess.Popen(["ip", "netns", "exec", ns, "unshare", "--uts", "--mount", "sh", "-c", setup],
                                    stdout=subprocess.DEVNULL, stderr=open(os.path.join(w, f"sshd-{h}.log"), "w"))
            self.sshd[h] = proc
            self.state["sshd"].append(proc.pid)
            self._save()
        for h in self.names:
            self._wait_ssh(h)

    def _wait_ssh(self, host):
        deadline = time.time() + 20
        while True:
            r = self.run(self.names[0], self.ssh(host) + ["true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            if r.returncode == 0:
                return
            if self.sshd[host].poll() is not None or time.time() > deadline:
                log = open(os.path.join(self.work, f"sshd-{host}.log")).read()
                raise RuntimeError(f"sshd on {host} did not answer: {r.stderr.decode()} {log}")
            time.sleep(0.1)

    def ssh(self, host):
        """An ssh command line that reaches host from any host of the bed."""
        return ["ssh", "-F", self.ssh_config, host]

    def ssh_args(self):
        """chorusrun's options that reach the bed's hosts."""
        return ["--ssh-port", str(self.port), "--ssh-identity-file", self.key,
                "--ssh-options", "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"]

    def enter(self, host, cwd=None):
        """The command prefix that runs a program on host (its network, name and
        mounts), in cwd (default: this process's)."""
        return ["nsenter", "-t", str(self.sshd[host].pid), "-n", "-u", "-m", f"--wd={cwd or os.getcwd()}", "--"]

    def run(self, host, args, cwd=None, **kw):
        """subprocess.run(args) on host."""
        return subprocess.run(self.enter(host, cwd) + list(args), **kw)

    def popen(self, host, args, cwd=None, **kw):
        return subprocess.Popen(self.enter(host, cwd) + list(args), **kw)

    def link(self, host, up):
        """Takes host's link to the bridge down (a pulled cable) or up again."""
        _sh("ip", "link", "set", f"{PREFIX}{self.bed}v{self.names.index(host) + 1}", "up" if up else "down")

    def loss(self, host, percent):
        """Drops that share of the packets host receives (iptables' statistic match;
        this kernel has no netem, so delay cannot be made). 0 removes the rule."""
        ns = f"{PREFIX}{self.bed}-{host}"
        _sh("ip", "netns", "exec", ns, "iptables", "-F", "INPUT")
        if percent > 0:
            _sh("ip", "netns", "exec", ns, "iptables", "-A", "INPUT", "-i", "eth0", "-m", "statistic", "--mode",
                "random", "--probability", str(percent / 100.0), "-j", "DROP")

    def rate(self, host, mbit):
        """Limits host's link to mbit Mbit/s each way (tc tbf); 0 removes the limit."""
        for dev, ns in ((f"{PREFIX}{self.bed}v{self.names.index(host) + 1}", None),
                        ("eth0", f"{PREFIX}{self.bed}-{host}")):
            pre = ["ip", "netns", "exec", ns] if ns else []
            _sh(*pre, "tc", "qdisc", "del", "dev", dev, "root", check=False)
            if mbit > 0:
                _sh(*pre, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{mbit}mbit", "burst", "256kb",
                    "latency", "50ms")

    def pids(self, host):
        """Processes running on host other than its sshd."""
        ns = f"{PREFIX}{self.bed}-{host}"
        out = _sh("ip", "netns", "pids", ns, check=False).stdout.split()
        return [int(p) for p in out if int(p) != self.sshd[host].pid]

    def kill(self, host, pattern, sig=signal.SIGKILL, one=False):
        """Sends sig to the processes on host whose command line holds pattern (not
        chorusrun's agents); the oldest alone with one=True. Returns their pids.
        (pkill would not do: the hosts share one PID namespace.)"""
        hit = []
        for pid in sorted(self.pids(host)):
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if pattern in cmd and "--rank-agent" not in cmd and not cmd.startswith("sshd"):
                os.kill(pid, sig)
                hit.append(pid)
                if one:
                    break
        return hit

    def shm(self, host):
        """The files in host's /dev/shm."""
        r = self.run(host, ["ls", "-A", "/dev/shm"], stdout=subprocess.PIPE, text=True, check=True)
        return r.stdout.split()

    def __exit__(self, *exc):
        _remove(self.state)
        if self.bed is not None and os.path.exists(self.state_path):
            os.unlink(self.state_path)
        return False


def main(argv):
    if len(argv) >= 2 and argv[1] == "up":
        bed = TestBed(int(argv[2]) if len(argv) > 2 else 2).__enter__()
        bed.state["owner"] = 1  # kept until "down"
        bed._save()
        print(f"bed {bed.bed}: " + ", ".join(f"{h} {bed.address(h)}" for h in bed.names))
        print(f"run on a host: {' '.join(bed.enter(bed.names[0]))} COMMAND")
        print(f"chorusrun options: {' '.join(bed.ssh_args())}")
        return 0
    if len(argv) == 2 and argv[1] == "down":
        if os.path.isdir(STATE):
            for name in os.listdir(STATE):
                path = os.path.join(STATE, name)
                _remove(json.load(open(path)))
                os.unlink(path)
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))

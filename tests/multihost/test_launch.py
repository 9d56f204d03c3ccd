"""chorusrun across hosts, on namespace hosts: the seeds' three command lines
(horovodrun's, deepspeed's with a hostfile, mpirun's), unreachable hosts, a remote
rank's failure, environment forwarding, per-rank logs, the store's binding."""
import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import WORKERS, chorusrun

pytestmark = pytest.mark.usefixtures("bed")


def run(bed, args, env=None, timeout=180, host="node1"):
    proc = bed.run(host, args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return proc


def no_leftovers(bed):
    for h in bed.names:
        deadline = time.time() + 10
        while bed.pids(h) and time.time() < deadline:
            time.sleep(0.1)
        assert bed.pids(h) == [], f"processes left on {h}: " + subprocess.run(
            ["ps", "-o", "pid,args", "-p", ",".join(map(str, bed.pids(h)))], stdout=subprocess.PIPE, text=True).stdout
        assert bed.shm(h) == [], f"/dev/shm left on {h}: {bed.shm(h)}"


def test_hosts_are_separate(bed):
    names = {h: run(bed, ["hostname"], host=h).stdout.strip() for h in bed.names}
    assert names == {"node1": "node1", "node2": "node2"}
    out = run(bed, bed.ssh("node2") + ["hostname; getent hosts node1"]).stdout
    assert out.split()[:2] == ["node2", bed.address("node1")], out


def test_horovodrun_form(bed, env):
    """horovodrun -np 4 -H node1:2,node2:2 python your_script.py, with chorusrun."""
    proc = run(bed, [chorusrun(), "-np", "4", "-H", "node1:2,node2:2", *bed.ssh_args(),
                     "-x", "EXTRA_SETTING=42", "python", os.path.join(WORKERS, "your_script.py"),
                     "EXTRA_SETTING=42", "HOROVOD_FUSION_THRESHOLD=1048576", "NOT_FORWARDED!"],
               env=dict(env, HOROVOD_FUSION_THRESHOLD="1048576", NOT_FORWARDED="x"))
    assert proc.returncode == 0, proc.stdout
    for r in range(4):
        assert re.search(rf"\[{r}\]<stdout>:rank {r} of 4 on node{r // 2 + 1}: trained", proc.stdout), proc.stdout
    no_leftovers(bed)


def test_deepspeed_form(bed, env, tmp_path):
    """deepspeed --num_nodes 2 --hostfile hostfile your_script.py, with chorusrun."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# the seed's hostfile\nnode1 slots=2\n\nnode2 slots=2\n")
    proc = run(bed, [chorusrun(), "--num_nodes", "2", "--hostfile", str(hostfile), *bed.ssh_args(),
                     os.path.join(WORKERS, "ds_script.py")], env=env)
    assert proc.returncode == 0, proc.stdout
    hosts = sorted(re.findall(r"ds rank (\d) on (node\d)", proc.stdout))
    assert hosts == [("0", "node1"), ("1", "node1"), ("2", "node2"), ("3", "node2")], proc.stdout
    # --include picks hosts and slots as DeepSpeed's does: 1 rank on node1, 2 on node2.
    proc = run(bed, [chorusrun(), "--hostfile", str(hostfile), "--include", "node1:1@node2", "--verbose",
                     *bed.ssh_args(), "--no_python", "true"], env=env)
    assert proc.returncode == 0, proc.stdout
    placed = re.findall(r"rank (\d) on (node\d)", proc.stdout)
    assert placed == [("0", "node1"), ("1", "node2"), ("2", "node2")], proc.stdout
    no_leftovers(bed)


@pytest.mark.skipif(not shutil.which("mpirun"), reason="needs Open MPI's mpirun")
def test_mpirun_form(bed, env):
    """The seed's mpirun line as it is, Open MPI's ssh pointed at the bed's sshd."""
    env = dict(env, OMPI_MCA_plm_rsh_agent="ssh -F " + bed.ssh_config, OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", LD_LIBRARY_PATH=env.get("LD_LIBRARY_PATH", ""),
               OMPI_MCA_btl_tcp_if_include="eth0", OMPI_MCA_oob_tcp_if_include="eth0")
    proc = run(bed, ["mpirun", "-np", "4", "-H", "node1:2,node2:2", "-bind-to", "none", "-map-by", "slot",
                     "-x", "NCCL_DEBUG=INFO", "-x", "LD_LIBRARY_PATH", "-x", "PATH",
                     "python", os.path.join(WORKERS, "your_script.py"), "NCCL_DEBUG=INFO"], env=env)
    assert proc.returncode == 0, proc.stdout
    for r in range(4):
        assert f"rank {r} of 4 on node{r // 2 + 1}: trained" in proc.stdout, proc.stdout
    no_leftovers(bed)


def test_unreachable_host_is_named_and_nothing_starts(bed, env):
    proc = run(bed, [chorusrun(), "-np", "4", "-H", "node1:2,node3:2", *bed.ssh_args(), "--start-timeout", "5",
                     "sh", "-c", "echo rank-ran"], env=env)
    assert proc.returncode == 2, proc.stdout
    assert "host 'node3' is not reachable over ssh" in proc.stdout, proc.stdout
    assert "rank-ran" not in proc.stdout
    bed.link("node2", up=False)  # a host whose link is down: named too
    try:
        proc = run(bed, [chorusrun(), "-np", "4", "-H", "node1:2,node2:2", *bed.ssh_args(), "--start-timeout", "3",
                         "true"], env=env, timeout=60)
    finally:
        bed.link("node2", up=True)
    assert proc.returncode == 2 and "host 'node2' is not reachable" in proc.stdout, proc.stdout


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_remote_rank_failure_stops_the_job(bed, env, how):
    # Rank 3 (on node2) fails while the others wait in a collective; all stop.
    fail = "sys.exit(3)" if how == "exit" else "os.kill(os.getpid(), 9)"
    script = ("import os, sys, time, torch, chorus.torch as hvd\nhvd.init()\n"
              f"if hvd.rank() == 3:\n    time.sleep(1); {fail}\n"
              "hvd.allreduce(torch.ones(1000000), name='wait')\n")
    proc = run(bed, [chorusrun(), "-np", "4", "-H", "node1:2,node2:2", *bed.ssh_args(), "python", "-c", script],
               env=dict(env, CHORUS_TIMEOUT_SECONDS="10"), timeout=120)
    want = "exited with code 3 on host node2" if how == "exit" else "was killed by signal 9 (Killed) on host node2"
    assert proc.returncode != 0 and f"rank 3 {want}" in proc.stdout, proc.stdout
    no_leftovers(bed)


def test_launcher_killed_stops_remote_ranks(bed, env):
    # The launcher dies without a word: its remote ranks' agents see their input end.
    p = bed.popen("node1", [chorusrun(), "-np", "4", "-H", "node1:2,node2:2", *bed.ssh_args(),
                            "sh", "-c", "echo up; exec sleep 600"], env=env, stdout=subprocess.PIPE, text=True)
    for _ in range(4):
        assert "up" in p.stdout.readline()
    p.kill()
    p.wait()
    no_leftovers(bed)


def test_output_filename_and_store_binding(bed, env, tmp_path):
    logs = tmp_path / "logs"
    script = "ss -ltn | grep -c \"$CHORUS_RENDEZVOUS_ADDR:$CHORUS_RENDEZVOUS_PORT\"; echo err >&2"
    proc = run(bed, [chorusrun(), "-np", "3", "-H", "node1:1,node2:2", *bed.ssh_args(), "--output-filename",
                     str(logs), "--network-interface", "eth0", "sh", "-c", script], env=env)
    assert proc.returncode == 0, proc.stdout
    assert sorted(os.listdir(logs)) == ["rank.0", "rank.1", "rank.2"]
    # The store listens on node1's eth0 address alone: rank 0 (node1) sees it there.
    assert (logs / "rank.0" / "stdout").read_text().strip() == "1"
    assert (logs / "rank.2" / "stderr").read_text() == "err\n"
    out = run(bed, [chorusrun(), "-np", "2", "-H", "node1:1,node2:1", *bed.ssh_args(), "--network-interface",
                    "eth0", "--verbose", "true"], env=env).stdout
    assert f"store on {bed.address('node1')}:" in out, out
    proc = run(bed, [chorusrun(), "-np", "2", "-H", "node1:1,node2:1", *bed.ssh_args(), "--network-interface",
                     "wlan9", "true"], env=env)
    assert proc.returncode == 2 and "network interface 'wlan9'" in proc.stdout and "eth0" in proc.stdout, proc.stdout


def test_torch_distributed_beside_chorus_across_hosts(bed, env):
    """torch.distributed's own group forms in a chorusrun job on two hosts: MASTER_ADDR
    is rank 0's host as the others reach it, MASTER_PORT a port of its own."""
    worker = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python", "workers",
                          "launch_env.py")
    proc = run(bed, [chorusrun(), "-np", "4", "-H", "node1:2,node2:2", *bed.ssh_args(),
                     "-x", "EXPECT_RANK_FROM=CHORUS_RANK", "-x", "EXPECT_SIZE=4", "python", worker, "--dist"], env=env)
    assert proc.returncode == 0, proc.stdout
    for r in range(4):
        assert f"ok rank {r} size 4 local_rank {r % 2} local_size 2" in proc.stdout, proc.stdout
    no_leftovers(bed)


def test_a_lossy_or_stalled_link_is_not_a_dead_peer(bed, env):
    """20% of the packets into node2 dropped, and the launcher's ssh to node2 stopped for
    15 s (its rank's agent hears nothing): the job goes on with the default timeouts."""
    import signal
    worker = os.path.join(WORKERS, "steady_job.py")
    proc = bed.popen("node1", [chorusrun(), "-np", "4", "-H", "node1:2,node2:2", *bed.ssh_args(),
                               "-x", "STEADY_SECONDS=30", "python", worker], env=env,
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(4)
        bed.loss("node2", 20)
        stopped = []
        for pid in bed.pids("node1"):  # the launcher's ssh clients to node2 (bed.kill skips them)
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if os.path.basename(cmd[0]) == b"ssh" and b"node2" in cmd:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        time.sleep(15)
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        out = proc.communicate(timeout=120)[0]
    finally:
        bed.loss("node2", 0)
        if proc.poll() is None:
            proc.kill()
    assert stopped, "no ssh client to stop"
    assert proc.returncode == 0, out
    assert out.count("steady rank") == 4, out
    no_leftovers(bed)


def test_a_link_down_names_the_host_and_its_ranks(bed, env):
    """node2's link pulled in a non-elastic job: the job ends, and the launcher says which
    host went and which ranks with it; the ranks' errors name them by global rank."""
    worker = os.path.join(WORKERS, "steady_job.py")
    proc = bed.popen("node1", [chorusrun(), "-np", "4", "-H", "node1:2,node2:2", *bed.ssh_args(),
                               "-x", "STEADY_SECONDS=60", "-x", "CHORUS_TIMEOUT_SECONDS=6", "python", worker],
                     env=dict(env, CHORUS_TIMEOUT_SECONDS="6"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     text=True)
    try:
        time.sleep(5)
        bed.link("node2", False)
        out = proc.communicate(timeout=120)[0]
    finally:
        bed.link("node2", True)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, out
    assert "host node2 does not answer" in out and "ranks 2, 3 there lost their link to the job" in out, out
    assert re.search(r"rank\(s\) [23]", out) or re.search(r"rank [23] ", out), out

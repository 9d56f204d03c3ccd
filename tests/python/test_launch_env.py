"""chorus started without chorusrun: as torchrun and Kubernetes' PyTorchJob set
torch.distributed's variables, as Slurm's srun sets its own, by mpirun, and by
nothing at all. Each test starts the processes itself with those variables."""
import os
import socket
import subprocess
import sys
import uuid

import pytest

from conftest import BUILD, WORKERS, discovery_script, have_mpi, ok

WORKER = os.path.join(WORKERS, "launch_env.py")
LAUNCHER_VARS = ("CHORUS_", "HOROVOD_", "OMPI_", "PMI", "SLURM_", "TORCHELASTIC_")
TORCH_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
              "CROSS_RANK", "CROSS_SIZE"}


def free_port():
    # Two free neighbours: MASTER_PORT for torch.distributed, the next for chorus.
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65535:
            try:
                with socket.socket() as t:
                    t.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise RuntimeError("no two free neighbouring ports")


def clean_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(LAUNCHER_VARS) and k not in TORCH_VARS}
    env["PYTHONPATH"] = os.path.join(BUILD, "python")
    env["OMP_NUM_THREADS"] = "1"
    return env


def start(envs, *args, timeout=120):
    procs = [subprocess.Popen([sys.executable, WORKER, *args], env=e, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for e in envs]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, "\n---\n".join(outs)
    return outs


def torch_envs(n, port, **extra):
    envs = []
    for r in range(n):
        e = clean_env()
        e.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n), GROUP_RANK="0",
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), EXPECT_RANK=str(r), EXPECT_SIZE=str(n))
        e.update(extra)
        envs.append(e)
    return envs


@pytest.mark.parametrize("n", [2, 3])
def test_torchrun_variables(n):
    outs = start(torch_envs(n, free_port()))
    for r, out in enumerate(outs):
        assert f"ok rank {r} size {n} local_rank {r} local_size {n}" in out, out


def test_torch_distributed_beside_chorus_on_master_port():
    # chorus's store must leave MASTER_PORT to torch.distributed's own TCPStore.
    start(torch_envs(2, free_port()), "--dist")


def test_secret_from_chorus_secret_and_mismatch_refused():
    port = free_port()
    start(torch_envs(2, port, CHORUS_SECRET="s" * 32))
    envs = torch_envs(2, free_port(), CHORUS_SECRET="a" * 32, CHORUS_START_TIMEOUT="5")
    envs[1]["CHORUS_SECRET"] = "b" * 32
    procs = [subprocess.Popen([sys.executable, WORKER], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for e in envs]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert procs[1].returncode != 0, outs[1]
    assert "secret" in outs[1], outs[1]


def test_slurm_variables():
    n = 3
    job = str(uuid.uuid4().int % 10**6)
    envs = []
    for r in range(n):
        e = clean_env()
        e.update(SLURM_PROCID=str(r), SLURM_NTASKS=str(n), SLURM_LOCALID=str(r), SLURM_NODEID="0",
                 SLURM_STEP_NODELIST="localhost", SLURM_JOB_ID=job, SLURM_STEP_ID="0",
                 EXPECT_RANK=str(r), EXPECT_SIZE=str(n))
        envs.append(e)
    outs = start(envs)
    for r, out in enumerate(outs):
        assert f"ok rank {r} size {n}" in out, out


def test_no_launcher_is_a_world_of_one():
    out = start([clean_env()])[0]
    assert "ok rank 0 size 1 local_rank 0 local_size 1" in out, out


@pytest.mark.skipif(not have_mpi(), reason="needs mpirun and chorus built with MPI")
def test_mpirun_variables(ranks):
    out = ok(ranks(2, WORKER, mpirun=True, env={"EXPECT_SIZE": "2", "EXPECT_RANK_FROM": "OMPI_COMM_WORLD_RANK"}))
    assert "ok rank 0 size 2" in out and "ok rank 1 size 2" in out, out


def chorusrun_env(**extra):
    env = clean_env()
    env.update(extra)
    return env


def test_torch_distributed_inside_chorusrun():
    # MASTER_PORT is torch.distributed's own, not chorus's store.
    proc = subprocess.run([os.path.join(BUILD, "chorusrun"), "-np", "3", sys.executable, WORKER, "--dist"],
                          env=chorusrun_env(EXPECT_RANK_FROM="CHORUS_RANK", EXPECT_SIZE="3"),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.count(" size 3 local_rank") == 3, proc.stdout


def test_torch_distributed_in_elastic_job(tmp_path):
    script = discovery_script(tmp_path, "localhost:2")
    proc = subprocess.run([os.path.join(BUILD, "chorusrun"), "--min-np", "2", "--max-np", "2",
                           "--host-discovery-script", str(script), "--elastic-timeout", "30",
                           sys.executable, WORKER, "--dist"],
                          env=chorusrun_env(EXPECT_RANK_FROM="RANK", EXPECT_SIZE="2"),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.count("ok rank") == 2, proc.stdout


ARGS_SCRIPT = """import os, sys
print("argv", os.environ["RANK"], sys.argv[1:], os.environ["CROSS_RANK"], os.environ["CROSS_SIZE"],
      os.environ["LOCAL_SIZE"], flush=True)
"""


def test_deepspeed_launcher_form(tmp_path):
    """Started as `deepspeed`, the script gets --local_rank=N after its name, as
    DeepSpeed's launcher gives it; --no_local_rank leaves it out;
    --enable_each_rank_log sends each rank's output to a file of its own."""
    launcher = tmp_path / "deepspeed"
    launcher.symlink_to(os.path.join(BUILD, "chorusrun"))
    script = tmp_path / "args.py"
    script.write_text(ARGS_SCRIPT)
    env = chorusrun_env()
    out = subprocess.run([str(launcher), "--num_gpus", "2", str(script), "--deepspeed", "--x=1"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60).stdout
    for r in range(2):
        assert f"argv {r} ['--local_rank={r}', '--deepspeed', '--x=1'] 0 1 2" in out, out
    out = subprocess.run([str(launcher), "--num_gpus", "2", "--no_local_rank", str(script), "--x=1"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60).stdout
    assert "argv 1 ['--x=1']" in out, out
    # chorusrun under its own name passes nothing extra.
    out = subprocess.run([os.path.join(BUILD, "chorusrun"), "-np", "2", str(script)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60).stdout
    assert "argv 1 []" in out, out
    logs = tmp_path / "logs"
    proc = subprocess.run([str(launcher), "--num_gpus", "2", "--enable_each_rank_log", str(logs), str(script)],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout
    assert "argv" not in proc.stdout, proc.stdout
    files = sorted(os.listdir(logs))
    assert [f.split("_", 1)[1] for f in files] == ["rank0.log", "rank1.log"], files
    assert "argv 1 ['--local_rank=1']" in (logs / files[1]).read_text()


def test_scripts_run_under_the_named_python(tmp_path):
    script = tmp_path / "which.py"
    script.write_text("import sys; print('python', sys.executable, flush=True)\n")
    env = chorusrun_env(PATH="/nonexistent:" + os.environ["PATH"])
    env.pop("CHORUS_PYTHON", None)
    out = subprocess.run([os.path.join(BUILD, "chorusrun"), "-np", "1", str(script)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60).stdout
    assert "python /usr/bin/python3" in out, out  # the build's interpreter, not PATH's first python3
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    out = subprocess.run([os.path.join(BUILD, "chorusrun"), "--python", str(venv / "bin" / "python"), "-np", "1",
                          str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=60).stdout
    assert f"python {venv}/bin/python" in out, out


def test_version_and_check_build():
    out = subprocess.run([os.path.join(BUILD, "chorusrun"), "--version"], stdout=subprocess.PIPE, text=True).stdout
    assert out.startswith("chorus ") and out.split()[1][0].isdigit(), out
    out = subprocess.run([os.path.join(BUILD, "chorusrun"), "--check-build"], env=clean_env(),
                         stdout=subprocess.PIPE, text=True, timeout=120).stdout
    for section in ("Available Frameworks", "Available Controllers", "Available Tensor Operations"):
        assert section in out, out
    # This interpreter has torch, so chorus.torch and chorus.deepspeed import; MPI is built here.
    assert "[X] PyTorch" in out and "[X] DeepSpeed" in out, out
    import chorus._core as core
    assert ("[X] MPI" in out) == bool(core.mpi_built()), out
    assert ("[X] NCCL" in out) == (core.nccl_built() > 0), out
    bad = subprocess.run([os.path.join(BUILD, "chorusrun"), "--log-level", "loud", "-np", "1", "true"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert bad.returncode == 2 and "--log-level 'loud'" in bad.stdout, bad.stdout

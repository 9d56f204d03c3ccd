"""The one line that makes `import deepspeed` chorus.deepspeed in an environment,
for code chorus does not own: install, what importlib.metadata and imports see,
uninstall, and the refusal to shadow a real DeepSpeed."""
import os
import subprocess
import sys

from conftest import BUILD


def venv(tmp_path):
    d = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(d)], check=True)
    return str(d / "bin" / "python")


def py(python, *args, code=None):
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"))
    cmd = [python, *(["-c", code] if code else args)]
    return subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)


def test_install_alias_and_uninstall(tmp_path):
    python = venv(tmp_path)
    assert py(python, code="import deepspeed").returncode != 0  # nothing there to begin with
    out = py(python, "-m", "chorus.deepspeed.alias", "install")
    assert out.returncode == 0 and "installed" in out.stdout, out.stdout
    check = py(python, code=(
        "import importlib.metadata as md, deepspeed, deepspeed.comm, deepspeed.zero, chorus.deepspeed as c\n"
        "from deepspeed.runtime.lr_schedules import VALID_LR_SCHEDULES\n"
        "from deepspeed.ops.adam import DeepSpeedCPUAdam\n"
        "from deepspeed.checkpoint.utils import clone_tensors_for_torch_save\n"
        "from deepspeed.utils import logger, set_z3_leaf_modules\n"
        "from deepspeed.accelerator import get_accelerator\n"
        "assert deepspeed is c and deepspeed.comm is c.comm and deepspeed.zero.Init is c.zero.Init\n"
        "assert deepspeed.comm.__spec__.name == 'chorus.deepspeed.comm'\n"
        "print('version', md.version('deepspeed'), deepspeed.__version__, get_accelerator().device_name())"))
    from chorus.deepspeed._version import DEEPSPEED_API_VERSION
    assert check.returncode == 0, check.stdout
    assert f"version {DEEPSPEED_API_VERSION} {DEEPSPEED_API_VERSION} cpu" in check.stdout, check.stdout
    assert "chorus's alias" in py(python, "-m", "chorus.deepspeed.alias", "status").stdout
    # ... and the `deepspeed` command is chorusrun in DeepSpeed's launcher form.
    script = tmp_path / "args.py"
    script.write_text("import sys; print('args', sys.argv[1:], flush=True)\n")
    ds = os.path.join(os.path.dirname(python), "deepspeed")
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"))
    run = subprocess.run([ds, "--num_gpus", "2", str(script), "--x"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=120)
    assert "args ['--local_rank=1', '--x']" in run.stdout, run.stdout
    out = py(python, "-m", "chorus.command_alias", "install", "horovodrun")
    hr = os.path.join(os.path.dirname(python), "horovodrun")
    run = subprocess.run([hr, "-np", "2", "-H", "localhost:2", str(script)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=120)
    assert run.stdout.count("args []") == 2, run.stdout
    out = py(python, "-m", "chorus.deepspeed.alias", "uninstall")
    assert out.returncode == 0 and "removed" in out.stdout, out.stdout
    assert py(python, code="import deepspeed").returncode != 0
    assert not os.path.exists(ds)


def test_never_shadows_a_real_deepspeed(tmp_path):
    python = venv(tmp_path)
    site = py(python, code="import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    info = os.path.join(site, "deepspeed-0.15.0.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.15.0\n")
    with open(os.path.join(info, "INSTALLER"), "w") as f:
        f.write("pip\n")
    out = py(python, "-m", "chorus.deepspeed.alias", "install")
    assert out.returncode != 0 and "real DeepSpeed 0.15.0" in out.stdout, out.stdout
    assert not os.path.exists(os.path.join(site, "deepspeed"))
    out = py(python, "-m", "chorus.deepspeed.alias", "uninstall")
    assert out.returncode != 0 and "leaving it alone" in out.stdout, out.stdout
    assert os.path.exists(info)


def test_horovod_alias_and_what_horovod_code_reaches_for(tmp_path):
    """`python -m chorus.alias install horovod`: `import horovod.torch as hvd` is chorus.torch,
    with the helpers Horovod's programs and tests import; uninstall removes it."""
    python = venv(tmp_path)
    out = py(python, "-m", "chorus.alias", "install", "horovod")
    assert out.returncode == 0 and "installed" in out.stdout, out.stdout
    check = py(python, code=(
        "import importlib.metadata as md, horovod, horovod.torch as hvd, chorus.torch as ct\n"
        "from horovod.common.util import is_version_greater_equal_than\n"
        "from horovod.runner.util.threads import in_thread\n"
        "from horovod.runner.common.util.env import get_env_rank_and_size\n"
        "from horovod.common.process_sets import ProcessSet\n"
        "import os, threading\n"
        "from horovod.common.util import _cache, env, extension_available, gloo_built\n"
        "seen = []\n"
        "f = _cache(lambda x: seen.append(x) or 2 * x)\n"
        "assert f(2) == 4 and f(2) == 4 and f(3) == 6 and seen == [2, 3]\n"
        "assert gloo_built() and extension_available('torch') and not extension_available('mxnet')\n"
        "with env(CHORUS_UTIL_T='1', CHORUS_UNSET=None):\n"
        "    assert os.environ['CHORUS_UTIL_T'] == '1' and 'CHORUS_UNSET' not in os.environ\n"
        "assert 'CHORUS_UTIL_T' not in os.environ\n"
        "assert hvd is ct and hvd.ProcessSet is ProcessSet\n"
        "assert is_version_greater_equal_than('2.10.1', '2.9') and not is_version_greater_equal_than('2.9', '2.10')\n"
        "done = threading.Event(); in_thread(done.set).join(); assert done.is_set()\n"
        "os.environ.update(OMPI_COMM_WORLD_RANK='3', OMPI_COMM_WORLD_SIZE='4')\n"
        "assert get_env_rank_and_size() == (3, 4)\n"
        "hvd.init(); assert hvd.mpi_ops._basics._get_process_set_ids_and_ranks() == {0: [0]}\n"
        "print('horovod', md.version('horovod'))"))
    assert check.returncode == 0 and "horovod 0.28.1" in check.stdout, check.stdout
    assert "chorus's alias" in py(python, "-m", "chorus.alias", "status", "horovod").stdout
    hr = os.path.join(os.path.dirname(python), "horovodrun")
    assert os.path.exists(hr)  # the command comes with the package alias
    out = py(python, "-m", "chorus.alias", "uninstall", "horovod")
    assert out.returncode == 0 and "removed" in out.stdout, out.stdout
    assert py(python, code="import horovod").returncode != 0 and not os.path.exists(hr)

#include "launcher/check_build.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "chorus/runtime.h"

namespace chorus::launcher {

namespace {

std::string folderOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// "1 0 1": whether chorus.torch, chorus.tensorflow and chorus.deepspeed import.
std::string probeFrameworks(const std::string& python, const std::string& self) {
  // The package is beside this binary: build/python/chorus, or site-packages/chorus.
  const std::string here = folderOf(self);
  std::string path = here + "/python:" + folderOf(here);
  if (const char* pp = std::getenv("PYTHONPATH"); pp && *pp) path += std::string(":") + pp;
  const std::string code =
      "import importlib\n"
      "def ok(m):\n"
      "    try:\n"
      "        importlib.import_module(m)\n"
      "        return '1'\n"
      "    except Exception:\n"
      "        return '0'\n"
      "print('frameworks', ok('chorus.torch'), ok('chorus.tensorflow'), ok('chorus.deepspeed'))\n";
  const std::string cmd = "PYTHONPATH='" + path + "' TF_CPP_MIN_LOG_LEVEL=3 '" + python + "' -c \"" + code + "\" 2>/dev/null";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    std::array<char, 256> buf{};
    while (fgets(buf.data(), buf.size(), p)) out += buf.data();
    pclose(p);
  }
  const size_t at = out.rfind("frameworks ");
  return at == std::string::npos ? "0 0 0" : out.substr(at + 11, 5);
}

void line(bool on, const std::string& what) { std::printf("    [%s] %s\n", on ? "X" : " ", what.c_str()); }

}  // namespace

int printCheckBuild(const LaunchOptions& o) {
  LaunchOptions probe = o;
  probe.command = {"probe.py"};
  probe.noPython = probe.module = false;
  const std::string python = resolveCommand(probe)[0];
  const std::string fw = probeFrameworks(python, selfPath());
  const int nccl = ncclBuilt();
  std::printf("chorus v%s:\n\nAvailable Frameworks (imported with %s):\n", CHORUS_VERSION, python.c_str());
  line(fw[2] == '1', "TensorFlow");
  line(fw[0] == '1', "PyTorch");
  line(fw[4] == '1', "DeepSpeed (chorus.deepspeed)");
  std::printf("\nAvailable Controllers:\n");
  line(mpiBuilt(), "MPI");
  line(true, "Gloo (chorus's TCP controller)");
  std::printf("\nAvailable Tensor Operations:\n");
  line(nccl > 0, nccl > 0 ? "NCCL " + std::to_string(nccl / 10000) + "." + std::to_string(nccl / 100 % 100) + "." +
                                std::to_string(nccl % 100)
                          : std::string("NCCL"));
  line(cudaBuilt(), "CUDA (staged through pinned memory)");
  line(mpiBuilt(), "MPI");
  line(true, "Gloo (chorus's TCP transport)");
  line(true, "Shared memory");
  return 0;
}

}  // namespace chorus::launcher

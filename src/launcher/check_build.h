#pragma once
// chorusrun --check-build: what this chorus can do, as horovodrun --check-build prints it.
#include "launcher/job_plan.h"

namespace chorus::launcher {

// Prints the frameworks (probed by importing them in the Python that runs
// scripts), controllers and tensor operations; returns chorusrun's exit code.
int printCheckBuild(const LaunchOptions& o);

}  // namespace chorus::launcher

#pragma once
// Umbrella header, plus a Horovod-like facade over one default Runtime per process.
#include "chorus/config.h"
#include "chorus/elastic.h"
#include "chorus/error.h"
#include "chorus/process_set.h"
#include "chorus/runtime.h"
#include "chorus/store.h"
#include "chorus/types.h"
#include "chorus/work.h"

namespace chorus {

// The process's default runtime (created on first use).
Runtime& defaultRuntime();

inline void init(Config config = {}) { defaultRuntime().init(std::move(config)); }
inline void shutdown() { defaultRuntime().shutdown(); }
inline bool isInitialized() { return defaultRuntime().isInitialized(); }
inline int rank() { return defaultRuntime().rank(); }
inline int size() { return defaultRuntime().size(); }
inline int localRank() { return defaultRuntime().localRank(); }
inline int localSize() { return defaultRuntime().localSize(); }
inline int crossRank() { return defaultRuntime().crossRank(); }
inline int crossSize() { return defaultRuntime().crossSize(); }

}  // namespace chorus

#include "chorus/chorus.h"

namespace chorus {

// The facade's one instance; everything else takes a Runtime explicitly.
Runtime& defaultRuntime() {
  static Runtime* instance = new Runtime();  // never destroyed: threads may outlive statics
  return *instance;
}

}  // namespace chorus

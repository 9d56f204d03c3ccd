cmake_policy(SET CMP0057 NEW)  # IN_LIST, also under cmake -P
# The layers of src/, lowest first, and what each may #include: a layer reaches
# only the layers below it, and the public headers (include/chorus) it names.
# Run at configure time (from CMakeLists.txt) and as the ctest
# layers_include_only_lower_layers (cmake -DSOURCE_DIR=... -P cmake/check_layers.cmake).
# docs/architecture.md draws the same picture.

# The public headers that hold only words (no runtime): any layer may use them.
set(words "chorus/error.h" "chorus/types.h" "chorus/config.h" "chorus/settings.h" "chorus/store.h")

# layer -> the layers it may include ("public" = every header of include/chorus).
set(reach_base "")
set(reach_reduce base)
set(reach_device base reduce)
set(reach_comm base reduce device)
set(reach_rendezvous base)
set(reach_core base reduce device comm rendezvous public)
set(reach_zero base reduce device public)
set(reach_launcher base rendezvous public)
set(reach_torch public)
set(reach_tensorflow public)
set(layers base reduce device comm rendezvous core zero launcher torch tensorflow)

# src/core reaches the data paths only through src/comm's interfaces and factory.
set(core_comm_allowed "comm/communicator.h" "comm/point_to_point.h" "comm/bootstrap.h" "comm/device_path.h")

set(bad "")
file(GLOB dirs LIST_DIRECTORIES true RELATIVE "${SOURCE_DIR}/src" "${SOURCE_DIR}/src/*")
foreach(d IN LISTS dirs)
  if(IS_DIRECTORY "${SOURCE_DIR}/src/${d}" AND NOT d IN_LIST layers)
    list(APPEND bad "src/${d}: a folder with no rule in cmake/check_layers.cmake")
  endif()
endforeach()

foreach(layer IN LISTS layers)
  file(GLOB_RECURSE files "${SOURCE_DIR}/src/${layer}/*.cc" "${SOURCE_DIR}/src/${layer}/*.h"
       "${SOURCE_DIR}/src/${layer}/*.inc" "${SOURCE_DIR}/src/${layer}/*.cu")
  set(reach ${reach_${layer}})
  foreach(f IN LISTS files)
    file(STRINGS "${f}" lines REGEX "^#include \"")
    file(RELATIVE_PATH rel "${SOURCE_DIR}" "${f}")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" header "${line}")
      string(REGEX REPLACE "/.*" "" top "${header}")
      if(top STREQUAL layer OR header IN_LIST words)
        continue()
      endif()
      if(top STREQUAL "chorus")
        if(NOT "public" IN_LIST reach)
          list(APPEND bad "${rel}: ${header} (src/${layer} may use only the public headers ${words})")
        endif()
      elseif(NOT top IN_LIST reach)
        list(APPEND bad "${rel}: ${header} (src/${layer} may include only ${reach})")
      elseif(layer STREQUAL "core" AND top STREQUAL "comm" AND NOT header IN_LIST core_comm_allowed)
        list(APPEND bad "${rel}: ${header} (src/core reaches src/comm only through ${core_comm_allowed})")
      endif()
    endforeach()
  endforeach()
endforeach()

if(bad)
  list(JOIN bad "\n  " text)
  message(FATAL_ERROR "an include crosses the layers (cmake/check_layers.cmake):\n  ${text}")
endif()

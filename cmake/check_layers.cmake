cmake_policy(SET CMP0057 NEW)  # IN_LIST, also under cmake -P
# src/core reaches the backends only through src/comm's interfaces and factory:
# an #include of anything else under comm/ from src/core fails. Run at configure
# time (from CMakeLists.txt) and as the ctest core_includes_only_comm_interfaces
# (cmake -DSOURCE_DIR=... -P cmake/check_layers.cmake).
set(allowed "comm/communicator.h" "comm/point_to_point.h" "comm/bootstrap.h" "comm/device_path.h")
file(GLOB core_files "${SOURCE_DIR}/src/core/*.cc" "${SOURCE_DIR}/src/core/*.h")
set(bad "")
foreach(f IN LISTS core_files)
  file(STRINGS "${f}" lines REGEX "^#include \"comm/")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" header "${line}")
    if(NOT header IN_LIST allowed)
      file(RELATIVE_PATH rel "${SOURCE_DIR}" "${f}")
      list(APPEND bad "${rel}: ${header}")
    endif()
  endforeach()
endforeach()
if(bad)
  list(JOIN bad "\n  " text)
  message(FATAL_ERROR "src/core may include only src/comm's interfaces and factory (${allowed}); found:\n  ${text}")
endif()

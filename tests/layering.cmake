# The layer order of the README's architecture section, enforced: a file may include its own layer's headers
# and those of layers below it, never one above. Fails listing every include that goes up.
#   cmake -DSRC=<repository root> -P tests/layering.cmake
#
# Layers, bottom (0) to top. A public header belongs to the component it declares.
set(rank_common 0)     # src/common/, types, units, log, error, checksum, thread pool, buffers
set(rank_kernels 1)    # kernels/, src/device/ (CPU and CUDA kernels, device detection)
set(rank_io 2)         # io/ (engine, backends, swap space, extent allocator)
set(rank_telemetry 3)  # src/telemetry/
set(rank_comm 4)       # src/comm/
set(rank_tier 5)       # src/tier/
set(rank_service 6)    # src/service/ (the node service and the tier manager's client side of it)
set(rank_placement 7)  # src/placement/
set(rank_optim 8)      # src/optim/
set(rank_python 9)     # src/python/
set(rank_tools 10)     # tools/

function(header_layer header out)  # header: the path inside an #include "..."
  set(layer "")
  if(header MATCHES "^tierswap/(types|units|log|error|checksum|thread_pool|aligned_buffer|process_config|setting|signal_cleanup)\\.hpp$"
     OR header MATCHES "^tierswap/detail/(env|json|paths|file|manifest|config_table|clock|process|temp_dir)\\.hpp$")
    set(layer common)
  elseif(header MATCHES "^tierswap/(kernels|cuda_kernels|cuda_runtime|device)\\.hpp$" OR header MATCHES "^kernels/")
    set(layer kernels)
  elseif(header MATCHES "^tierswap/(io_engine|swap_space|extent_allocator)\\.hpp$"
         OR header MATCHES "^tierswap/detail/io_backend\\.hpp$" OR header MATCHES "^io/")
    set(layer io)
  elseif(header MATCHES "^tierswap/(telemetry|metrics)\\.hpp$")
    set(layer telemetry)
  elseif(header MATCHES "^tierswap/communicator\\.hpp$")
    set(layer comm)
  elseif(header MATCHES "^tierswap/tier_manager\\.hpp$" OR header MATCHES "^tierswap/detail/tier_pools\\.hpp$"
         OR header MATCHES "^src/tier/")
    set(layer tier)
  elseif(header MATCHES "^tierswap/service\\.hpp$" OR header MATCHES "^src/service/")
    set(layer service)
  elseif(header MATCHES "^tierswap/placement\\.hpp$" OR header MATCHES "^src/placement/")
    set(layer placement)
  elseif(header MATCHES "^tierswap/(optimizer|tiered_optimizer)\\.hpp$" OR header MATCHES "^src/optim/")
    set(layer optim)
  elseif(header MATCHES "^tools/")
    set(layer tools)
  endif()
  set(${out} "${layer}" PARENT_SCOPE)
endfunction()

function(file_layer path out)  # path relative to the repository root
  set(layer "")
  if(path MATCHES "^src/common/")
    set(layer common)
  elseif(path MATCHES "^(kernels|src/device)/")
    set(layer kernels)
  elseif(path MATCHES "^io/")
    set(layer io)
  elseif(path MATCHES "^src/(telemetry|comm|tier|service|placement|optim|python)/")
    string(REGEX REPLACE "^src/([a-z]+)/.*" "\\1" layer "${path}")
  elseif(path MATCHES "^tools/")
    set(layer tools)
  elseif(path MATCHES "^include/")
    string(REGEX REPLACE "^include/" "" h "${path}")
    header_layer("${h}" layer)
  endif()
  set(${out} "${layer}" PARENT_SCOPE)
endfunction()

file(GLOB_RECURSE files RELATIVE ${SRC} ${SRC}/src/*.cpp ${SRC}/src/*.hpp ${SRC}/src/*.cu
     ${SRC}/io/*.cpp ${SRC}/io/*.hpp ${SRC}/kernels/*.cpp ${SRC}/kernels/*.hpp ${SRC}/kernels/*.cu
     ${SRC}/include/*.hpp ${SRC}/tools/*.cpp ${SRC}/tools/*.hpp)
set(violations "")
set(checked 0)
foreach(f ${files})
  file_layer("${f}" from)
  if(from STREQUAL "")
    string(APPEND violations "\n  ${f}: in no layer (add it to tests/layering.cmake)")
    continue()
  endif()
  file(STRINGS ${SRC}/${f} lines REGEX "^#include \"")
  foreach(line ${lines})
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" inc "${line}")
    header_layer("${inc}" to)
    if(to STREQUAL "")
      string(APPEND violations "\n  ${f}: #include \"${inc}\" is in no layer")
    elseif(${rank_${to}} GREATER ${rank_${from}})
      string(APPEND violations "\n  ${f} (${from}) includes \"${inc}\" (${to}): up the layer order")
    endif()
    math(EXPR checked "${checked} + 1")
  endforeach()
endforeach()
if(violations)
  message(FATAL_ERROR "layering: includes against the layer order (tools/docs/design.md):${violations}")
endif()
message(STATUS "layering: ${checked} includes in ${SRC} respect the layer order")

# The C++ examples of the README and of the documentation pages (tools/docs/*.md) compile
# against the library as written: each ```cpp block becomes a function of a generated source
# (its #include lines hoisted to the top, the names it leaves to the reader declared in a
# prelude), built with the normal build, so an example that drifts from the API fails the build. CMake re-reads the pages when they change.
set(_readme "${PROJECT_SOURCE_DIR}/README.md")
file(GLOB _pages "${PROJECT_SOURCE_DIR}/tools/docs/*.md")
set(_text "")
foreach(_page IN ITEMS "${_readme}" ${_pages})
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_page}")
  file(READ "${_page}" _page_text)
  string(APPEND _text "${_page_text}\n")
endforeach()
set(_fence "```")
set(_includes "")
set(_bodies "")
set(_n 0)
while(TRUE)
  string(FIND "${_text}" "${_fence}cpp\n" _at)
  if(_at EQUAL -1)
    break()
  endif()
  math(EXPR _from "${_at} + 7")
  string(SUBSTRING "${_text}" ${_from} -1 _text)
  string(FIND "${_text}" "${_fence}" _end)
  string(SUBSTRING "${_text}" 0 ${_end} _block)
  string(SUBSTRING "${_text}" ${_end} -1 _text)
  string(REGEX MATCHALL "#include <[^>\n]+>" _inc "${_block}")
  list(APPEND _includes ${_inc})
  string(REGEX REPLACE "#include <[^>\n]+>" "" _block "${_block}")
  string(APPEND _bodies "[[maybe_unused]] void readme_example_${_n}() {\n${_block}}\n\n")
  math(EXPR _n "${_n} + 1")
endwhile()
if(_n LESS 2)
  message(FATAL_ERROR "tests/readme_cpp.cmake: found ${_n} cpp blocks in README.md and tools/docs (expected the "
                      "one-object setup and the service client at least)")
endif()
list(REMOVE_DUPLICATES _includes)
list(JOIN _includes "\n" _includes)
set(_src "${CMAKE_CURRENT_BINARY_DIR}/readme_cpp_examples.cpp")
file(WRITE "${_src}.new" "// Generated from README.md by tests/readme_cpp.cmake: do not edit.
${_includes}
#include <tierswap/tiered_optimizer.hpp>
#include <tierswap/service.hpp>

#include <cstdint>
#include <span>

namespace {
// What the examples leave to the reader.
const tierswap::ParamInit init_fn = [](tierswap::ParamId, std::uint64_t, float*, std::uint64_t) {};
const std::uint16_t grad_bf16[1] = {};
}  // namespace

${_bodies}")
file(COPY_FILE "${_src}.new" "${_src}" ONLY_IF_DIFFERENT)
add_library(readme_cpp_examples OBJECT "${_src}")
target_link_libraries(readme_cpp_examples PRIVATE tierswap)
target_compile_options(readme_cpp_examples PRIVATE -Wno-unused-variable -Wno-unused-function)

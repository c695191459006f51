# End-to-end: `tierswap demo` (the main job) on a kept directory, `residency --swap-dir` on what it
cmake_policy(SET CMP0054 NEW)
# committed, `ps`, `bench tier`, and the errors for bad targets.
set(dir "${WORK}/cli-tiers")
file(REMOVE_RECURSE "${dir}")
file(MAKE_DIRECTORY "${dir}")
execute_process(COMMAND ${CLI} demo --dir ${dir} --params 2M --subgroups 4 --steps 2 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "demo failed (${rc}): ${err}")
endif()
string(JSON nsteps LENGTH "${out}" steps)
if(NOT nsteps EQUAL 2)
  message(FATAL_ERROR "demo: expected 2 steps: ${out}")
endif()
foreach(key pid simulated_device tiers classes generation counters)
  string(JSON v ERROR_VARIABLE e GET "${out}" residency ${key})
  if(e)
    message(FATAL_ERROR "demo residency lacks ${key}: ${out}")
  endif()
endforeach()
string(JSON sim GET "${out}" residency simulated_device)
string(JSON gen GET "${out}" residency generation committed)
if(NOT gen EQUAL 3)
  message(FATAL_ERROR "demo: expected committed generation 3 (setup + 2 steps), got ${gen}")
endif()

execute_process(COMMAND ${CLI} residency --swap-dir ${dir} --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "residency --swap-dir failed (${rc}): ${err}")
endif()
string(JSON gen GET "${out}" generation committed)
string(JSON verified GET "${out}" generation checksums_verified)
string(JSON tier0 GET "${out}" tiers 0 tier)
string(JSON nvme_bytes GET "${out}" tiers 0 resident_bytes)
if(NOT gen EQUAL 3 OR NOT verified OR NOT tier0 STREQUAL "nvme" OR NOT nvme_bytes EQUAL 33554432)
  message(FATAL_ERROR "offline residency: gen=${gen} verified=${verified} ${tier0} ${nvme_bytes}: ${out}")
endif()
execute_process(COMMAND ${CLI} residency --swap-dir ${dir}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "checksums verified" OR NOT out MATCHES "sg3.exp_avg_sq")
  message(FATAL_ERROR "residency tables: ${out} ${err}")
endif()

# A corrupt manifest is named, and nothing is changed.
file(READ "${dir}/tierswap.manifest" good HEX)
file(APPEND "${dir}/tierswap.manifest" "junk")
execute_process(COMMAND ${CLI} residency --swap-dir ${dir} RESULT_VARIABLE rc ERROR_VARIABLE err
                OUTPUT_QUIET)
if(rc EQUAL 0 OR NOT err MATCHES "tierswap.manifest")
  message(FATAL_ERROR "corrupt manifest accepted or unclear: rc=${rc} ${err}")
endif()
file(REMOVE_RECURSE "${dir}")

foreach(bad "residency;99999999" "residency" "residency;--swap-dir;/nonexistent/x"
            "demo;--params;10" "bench;tier;--blocks;2")
  execute_process(COMMAND ${CLI} ${bad} RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  if(rc EQUAL 0 OR err STREQUAL "")
    message(FATAL_ERROR "'${bad}' was accepted or gave no error: ${err}")
  endif()
endforeach()

execute_process(COMMAND ${CLI} ps --json RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(JSON v ERROR_VARIABLE e GET "${out}" processes)
if(NOT rc EQUAL 0 OR e)
  message(FATAL_ERROR "ps --json: ${rc} ${out} ${err}")
endif()

execute_process(COMMAND ${CLI} bench tier --block-bytes 1MiB --blocks 8 --host-blocks 3 --runs 1
                        --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(JSON ratio ERROR_VARIABLE e GET "${out}" median_ratio)
string(JSON misses ERROR_VARIABLE e2 GET "${out}" runs 0 prefetch_misses)
if(NOT rc EQUAL 0 OR e OR e2)
  message(FATAL_ERROR "bench tier: ${rc} ${out} ${err}")
endif()

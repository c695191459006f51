# End-to-end check of `tierswap bench io --json` and its error reporting.
execute_process(COMMAND ${CLI} bench io --size 16MiB --block-size 256KiB --queue-depth 8 --runs 2
                        --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench io failed (${rc}): ${err}")
endif()
string(JSON n LENGTH "${out}" runs)
if(NOT n EQUAL 4)
  message(FATAL_ERROR "expected 4 runs (2 x write+read), got ${n}: ${out}")
endif()
math(EXPR last "${n} - 1")
foreach(i RANGE ${last})
  foreach(key backend mode block_size queue_depth bytes seconds gbps cpu_s_per_gib)
    string(JSON v ERROR_VARIABLE e GET "${out}" runs ${i} ${key})
    if(e)
      message(FATAL_ERROR "run ${i} lacks ${key}: ${out}")
    endif()
  endforeach()
  string(JSON bytes GET "${out}" runs ${i} bytes)
  string(JSON bs GET "${out}" runs ${i} block_size)
  if(NOT bytes EQUAL 16777216 OR NOT bs EQUAL 262144)
    message(FATAL_ERROR "run ${i}: bytes=${bytes} block_size=${bs}")
  endif()
endforeach()
string(JSON mode0 GET "${out}" runs 0 mode)
string(JSON mode1 GET "${out}" runs 1 mode)
if(NOT mode0 STREQUAL "write" OR NOT mode1 STREQUAL "read")
  message(FATAL_ERROR "modes: ${mode0} ${mode1}")
endif()

# TIERSWAP_IO_CONFIG (what `tierswap tune` writes) sets what no option gives, as for every engine;
# an option given wins; a file that cannot be read is named.
set(config "${CMAKE_CURRENT_BINARY_DIR}/bench-io-config.json")
file(WRITE "${config}" [[{"backend": "posix", "block_size": 131072, "queue_depth": 6}]])
foreach(case "--runs;1;posix;131072;6" "--runs;1;--queue-depth;3;posix;131072;3"
             "--runs;1;--block-size;64KiB;--backend;auto;any;65536;6")
  list(POP_BACK case depth block backend)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env TIERSWAP_IO_CONFIG=${config}
                          ${CLI} bench io --size 4MiB --mode write --json ${case}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "bench io ${case} with TIERSWAP_IO_CONFIG failed (${rc}): ${err}")
  endif()
  string(JSON got_block GET "${out}" runs 0 block_size)
  string(JSON got_depth GET "${out}" runs 0 queue_depth)
  string(JSON got_backend GET "${out}" runs 0 backend)
  string(JSON got_config GET "${out}" io_config)
  if(NOT got_block EQUAL block OR NOT got_depth EQUAL depth OR NOT got_config STREQUAL config
     OR (NOT backend STREQUAL "any" AND NOT got_backend STREQUAL backend))
    message(FATAL_ERROR "bench io ${case} under ${config}: block ${got_block}, depth "
                        "${got_depth}, backend ${got_backend}, io_config ${got_config}")
  endif()
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} -E env TIERSWAP_IO_CONFIG=${CMAKE_CURRENT_BINARY_DIR}
                        ${CLI} bench io --size 4MiB
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(rc EQUAL 0 OR NOT err MATCHES "TIERSWAP_IO_CONFIG=.*: cannot read it \\(Is a directory\\)")
  message(FATAL_ERROR "bench io with a directory as TIERSWAP_IO_CONFIG: rc=${rc} ${err}")
endif()
file(REMOVE "${config}")

# Bad input: a clear error naming the option, non-zero exit.
execute_process(COMMAND ${CLI} bench io --size 12XB RESULT_VARIABLE rc ERROR_VARIABLE err
                OUTPUT_QUIET)
if(rc EQUAL 0 OR NOT err MATCHES "--size")
  message(FATAL_ERROR "bad --size accepted or unclear: rc=${rc} ${err}")
endif()
execute_process(COMMAND ${CLI} bench io --size 1MiB --dir /nonexistent/tierswap
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(rc EQUAL 0 OR NOT err MATCHES "--dir: Directory does not exist: /nonexistent/tierswap")
  message(FATAL_ERROR "missing --dir accepted or unclear: rc=${rc} ${err}")
endif()
foreach(bad "--block-size;3;--block-size 3: .*must be a multiple of 4096"
            "--queue-depth;0;--queue-depth: Value 0 not in range 1 to 4096")
  list(GET bad 0 flag)
  list(GET bad 1 value)
  list(GET bad 2 want)
  execute_process(COMMAND ${CLI} bench io --size 1MiB ${flag} ${value}
                  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  if(rc EQUAL 0 OR NOT err MATCHES "${want}")
    message(FATAL_ERROR "bench io ${flag} ${value} accepted or unclear: rc=${rc} ${err}")
  endif()
endforeach()
execute_process(COMMAND ${CLI} bench io --size 1MiB --backend spdk
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(rc EQUAL 0 OR NOT err MATCHES "backend")
  message(FATAL_ERROR "bad --backend accepted or unclear: rc=${rc} ${err}")
endif()

# The sweep: every block size x depth x backend, write and read, and a best configuration each.
execute_process(COMMAND ${CLI} bench io --sweep --size 8MiB --runs 1 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench io --sweep failed (${rc}): ${err}")
endif()
string(JSON n LENGTH "${out}" runs)
if(NOT n EQUAL 90)
  message(FATAL_ERROR "sweep: expected 90 runs (5 block sizes x 3 depths x 3 backends x 2), got ${n}")
endif()
foreach(mode write read)
  string(JSON best ERROR_VARIABLE e GET "${out}" best ${mode} backend)
  if(e)
    message(FATAL_ERROR "sweep: no best ${mode} configuration: ${out}")
  endif()
endforeach()

# --buffer-file: the ring is the file's first block x depth bytes, mapped shared (the file's
# contents are what the engine moved); a file too small, missing, or with --service is refused.
set(buffer "${CMAKE_CURRENT_BINARY_DIR}/bench-io-buffer")
file(REMOVE "${buffer}")
execute_process(COMMAND truncate -s 1M "${buffer}")
execute_process(COMMAND ${CLI} bench io --size 4MiB --block-size 256KiB --queue-depth 4 --runs 1
                        --buffer-file "${buffer}" --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench io --buffer-file failed (${rc}): ${err}")
endif()
string(JSON n LENGTH "${out}" runs)
file(READ "${buffer}" head LIMIT 64 HEX)
if(NOT n EQUAL 2 OR head MATCHES "^0+$")
  message(FATAL_ERROR "bench io --buffer-file: ${n} runs, the file's first bytes ${head}")
endif()
execute_process(COMMAND truncate -s 512K "${buffer}")
foreach(bad "${buffer};it holds 524288 B; the ring needs 1.00 MiB"
            "${buffer}.missing;cannot open it \\(No such file or directory\\)")
  list(GET bad 0 path)
  list(GET bad 1 want)
  execute_process(COMMAND ${CLI} bench io --size 4MiB --block-size 256KiB --queue-depth 4
                          --buffer-file "${path}"
                  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  if(rc EQUAL 0 OR NOT err MATCHES "--buffer-file ${path}: ${want}")
    message(FATAL_ERROR "bench io --buffer-file ${path} accepted or unclear: rc=${rc} ${err}")
  endif()
endforeach()
execute_process(COMMAND ${CLI} bench io --size 4MiB --service /nonexistent.sock
                        --buffer-file "${buffer}"
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(rc EQUAL 0 OR NOT err MATCHES "--service with --buffer-file")
  message(FATAL_ERROR "bench io --service --buffer-file accepted or unclear: rc=${rc} ${err}")
endif()
file(REMOVE "${buffer}")

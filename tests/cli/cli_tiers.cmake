# End-to-end: `tierswap demo` (the main job) on a kept directory, `residency --swap-dir` on what it
cmake_policy(SET CMP0054 NEW)
# committed, `ps`, `bench tier`, and the errors for bad targets.
set(dir "${WORK}/cli-tiers/new")  # demo --dir makes a directory that does not exist yet
file(REMOVE_RECURSE "${WORK}/cli-tiers")
execute_process(COMMAND ${CLI} demo --dir ${dir} --params 2097152 --sub-group 262144 --host-budget 16MiB
                        --steps 2 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "demo failed (${rc}): ${err}")
endif()
# A directory that holds something (here the run above) is refused, and left as it was.
execute_process(COMMAND ${CLI} demo --dir ${dir} --params 2M --steps 1
                RESULT_VARIABLE rc2 OUTPUT_VARIABLE out2 ERROR_VARIABLE err2)
if(rc2 EQUAL 0 OR NOT err2 MATCHES "not empty")
  message(FATAL_ERROR "demo into a non-empty --dir: rc=${rc2} ${err2}")
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
string(JSON params GET "${out}" params)
string(JSON read2 GET "${out}" steps 1 nvme_read_bytes)
string(JSON written2 GET "${out}" steps 1 nvme_written_bytes)
math(EXPR state "${params} * 12")
math(EXPR state_max "${state} + 65536")  # blocks round up to 4 KiB extents
# Every state byte is written once; it is read at most once, and at least all of it that the
# 16 MiB pinned budget cannot have kept (the gradients wait outside it, in pageable memory).
math(EXPR read_min "${state} - 16777216")
if(read2 LESS read_min OR read2 GREATER state_max OR written2 LESS state OR written2 GREATER state_max)
  message(FATAL_ERROR "demo step 2: NVMe read ${read2} (${read_min}..${state_max}) written ${written2}, expected ${state}")
endif()
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
if(NOT gen EQUAL 3 OR NOT verified OR NOT tier0 STREQUAL "nvme" OR nvme_bytes LESS state OR
   nvme_bytes GREATER state_max)
  message(FATAL_ERROR "offline residency: gen=${gen} verified=${verified} ${tier0} ${nvme_bytes}: ${out}")
endif()
execute_process(COMMAND ${CLI} residency --swap-dir ${dir}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "checksums verified" OR NOT out MATCHES "g0.r0.s1.exp_avg_sq")
  message(FATAL_ERROR "residency tables: ${out} ${err}")
endif()

# A directory named without --swap-dir is read as a swap directory; a path that is neither a
# socket nor a directory says so.
execute_process(COMMAND ${CLI} residency ${dir} --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(JSON gen2 ERROR_VARIABLE e GET "${out}" generation committed)
if(NOT rc EQUAL 0 OR e OR NOT gen2 EQUAL gen)
  message(FATAL_ERROR "residency DIR: ${rc} ${err} ${out}")
endif()
execute_process(COMMAND ${CLI} residency ${dir}/tierswap.manifest
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "is not a socket")
  message(FATAL_ERROR "residency FILE: ${rc} ${err}")
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
            "demo;--params;10" "bench;tier;--blocks;2" "bench;step;--optimizer;sgd"
            "bench;step;--grad-tier;gpu" "bench;step;--overlap;--backward-ms;-1"
            "plan;--params;20B;--profile;no-such-profile" "plan;--params;20X;--profile;gh200"
            "plan;--params;2T;--profile;pcie4-workstation" "plan;--params;1B;--profile;gh200;--gpus;4"
            "bench;step;--memory-only" "bench;step;--overlap;--state;gpu"
            "bench;step;--overlap;--memory-only"
            "bench;step;--state;host;--memory-only;--params;64M;--host-budget;1MiB"
            "bench;step;--param16-in-place" "bench;step;--trainer-seconds;0"
            "bench;step;--trainer-seconds;1;--overlap" "bench;step;--trainer-seconds;1;--lend")
  execute_process(COMMAND ${CLI} ${bad} RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  if(rc EQUAL 0 OR err STREQUAL "")
    message(FATAL_ERROR "'${bad}' was accepted or gave no error: ${err}")
  endif()
endforeach()
# Output files and measured directories that cannot be: named by the option before any work.
foreach(bad "probe;--topology-only;--out;/nonexistent/x/p.json|--out: /nonexistent/x/p.json: its directory /nonexistent/x does not exist"
            "plan;--params;1M;--profile;gh200;--out;/nonexistent/x/p.json|--out: /nonexistent/x/.*: its directory"
            "tune;--dir;${WORK};--out;/nonexistent/x/io.json|--out: /nonexistent/x/.*: its directory"
            "tune;--dir;${WORK};--plot;/nonexistent/x/io.png|--plot: /nonexistent/x/io.png: its directory"
            "probe;--nvme-dir;/nonexistent/x|--nvme-dir: Directory does not exist")
  string(REPLACE "|" ";" parts "${bad}")
  list(POP_BACK parts want)
  execute_process(COMMAND ${CLI} ${parts} RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  if(rc EQUAL 0 OR NOT err MATCHES "${want}")
    message(FATAL_ERROR "'${parts}': accepted or unclear (want '${want}'): ${rc} ${err}")
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

# bench step: the schema, 12 + 12 bytes per parameter, pinned memory within the budget; --keep
# leaves a durable swap directory that residency --swap-dir reads; without it nothing is left.
set(sdir "${WORK}/cli-step")
file(REMOVE_RECURSE "${sdir}")
file(MAKE_DIRECTORY "${sdir}")
execute_process(COMMAND ${CLI} bench step --params 2097152 --sub-group 262144 --host-budget 12MiB --runs 1
                        --dir ${sdir} --keep --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench step failed (${rc}): ${err}")
endif()
foreach(key params io_only_s step_s zero_infinity_step_s nvme_read_bytes_per_param
            nvme_write_bytes_per_param fp32_grad_bytes peak_pinned_bytes host_budget_bytes)
  string(JSON v ERROR_VARIABLE e GET "${out}" ${key})
  if(e)
    message(FATAL_ERROR "bench step JSON lacks ${key}: ${out}")
  endif()
endforeach()
string(JSON rd GET "${out}" nvme_read_bytes_per_param)
string(JSON wr GET "${out}" nvme_write_bytes_per_param)
string(JSON peak GET "${out}" peak_pinned_bytes)
string(JSON budget GET "${out}" host_budget_bytes)
string(JSON fp32 GET "${out}" fp32_grad_bytes)
# Writes: every state byte once. Reads: at most that (the budget may still cache some).
if(NOT wr EQUAL 12 OR rd GREATER 12 OR rd LESS 6 OR peak GREATER budget OR NOT fp32 EQUAL 0)
  message(FATAL_ERROR "bench step: read ${rd} written ${wr} B/param, peak ${peak} of ${budget}")
endif()
# --disk-busy: each pass's fraction of time with a request in flight on the disk under --dir, in
# [0, 1] for each of the three passes; refused where there is no block device or with --overlap.
set(bdir "${WORK}/cli-step-busy")
file(REMOVE_RECURSE "${bdir}")
file(MAKE_DIRECTORY "${bdir}")
execute_process(COMMAND ${CLI} bench step --params 2097152 --sub-group 262144 --host-budget 12MiB --runs 1
                        --dir ${bdir} --disk-busy --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE bout ERROR_VARIABLE err)
if(rc EQUAL 0)
  foreach(pass io_only step zero_infinity)
    string(JSON busy ERROR_VARIABLE e GET "${bout}" median_disk_busy ${pass})
    string(JSON run_busy ERROR_VARIABLE e2 GET "${bout}" runs 0 disk_busy ${pass})
    string(JSON depth ERROR_VARIABLE e3 GET "${bout}" runs 0 disk_mean_inflight ${pass})
    if(e OR e2 OR e3 OR busy LESS 0 OR busy GREATER 1 OR NOT busy STREQUAL run_busy OR depth LESS 0)
      message(FATAL_ERROR "bench step --disk-busy: ${pass}: ${busy} ${run_busy} ${depth}: ${bout}")
    endif()
  endforeach()
elseif(NOT err MATCHES "--disk-busy: .* is not on a block device")
  message(FATAL_ERROR "bench step --disk-busy failed (${rc}): ${err}")
endif()
execute_process(COMMAND ${CLI} bench step --params 2097152 --runs 1 --overlap --disk-busy
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "--disk-busy: not with --overlap")
  message(FATAL_ERROR "bench step --overlap --disk-busy: ${rc} ${err}")
endif()
# A missing --dir is named by the option before anything runs (bench step, bench io, tune).
execute_process(COMMAND ${CLI} bench step --params 2097152 --runs 1 --dir ${bdir}/missing --disk-busy
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "--dir: Directory does not exist: .*missing")
  message(FATAL_ERROR "bench step --disk-busy --dir missing: ${rc} ${err}")
endif()
# --lend: the step reads the gradients where the bench left them; the same state bytes move.
execute_process(COMMAND ${CLI} bench step --params 2097152 --sub-group 262144 --host-budget 12MiB --runs 1
                        --lend --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE lout ERROR_VARIABLE err)
string(JSON lend ERROR_VARIABLE e GET "${lout}" lend)
string(JSON lwr ERROR_VARIABLE e2 GET "${lout}" nvme_write_bytes_per_param)
if(NOT rc EQUAL 0 OR e OR e2 OR NOT lend OR NOT lwr EQUAL 12)
  message(FATAL_ERROR "bench step --lend: ${rc} ${lout} ${err}")
endif()
# --state host (no --overlap): tierswap's ingest + step alone, with host-resident state; not with
# --bf16-moments (which compares NVMe bytes).
execute_process(COMMAND ${CLI} bench step --params 2097152 --sub-group 262144 --host-budget 64MiB --runs 2
                        --state host --memory-only --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE hout ERROR_VARIABLE err)
string(JSON hstate ERROR_VARIABLE e GET "${hout}" state)
string(JSON hstep ERROR_VARIABLE e2 GET "${hout}" step_s)
string(JSON hruns ERROR_VARIABLE e3 LENGTH "${hout}" runs_step_s)
if(NOT rc EQUAL 0 OR e OR e2 OR e3 OR NOT hstate STREQUAL "host" OR NOT hstep GREATER 0
   OR NOT hruns EQUAL 2)
  message(FATAL_ERROR "bench step --state host: ${rc} ${hout} ${err}")
endif()
# --trainer-seconds: a step per simulated forward + backward, each step's exposed time; the
# sub-groups step during the backward, the commit beside the next forward.
execute_process(COMMAND ${CLI} bench step --params 2097152 --sub-group 262144 --host-budget 12MiB --runs 2
                        --trainer-seconds 0.05 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE tout ERROR_VARIABLE err)
string(JSON tsteps ERROR_VARIABLE e LENGTH "${tout}" steps)
string(JSON texposed ERROR_VARIABLE e2 GET "${tout}" exposed_s)
string(JSON tspeed ERROR_VARIABLE e3 GET "${tout}" speed_fraction)
string(JSON tover ERROR_VARIABLE e4 GET "${tout}" steps 1 overlapped_subgroups)
if(NOT rc EQUAL 0 OR e OR e2 OR e3 OR e4 OR NOT tsteps EQUAL 2 OR texposed LESS 0
   OR NOT tspeed GREATER 0 OR tspeed GREATER 1 OR NOT tover GREATER 0)
  message(FATAL_ERROR "bench step --trainer-seconds: ${rc} ${tout} ${err}")
endif()
# Without --sub-group: the size TieredOptimizer picks for the budget (64 MiB / (3 x 4 x 12 B),
# whole 8192-element chunks), as a tierswap.torch user gets.
execute_process(COMMAND ${CLI} bench step --params 2097152 --host-budget 64MiB --runs 1
                        --state host --memory-only --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE aout ERROR_VARIABLE err)
string(JSON asg ERROR_VARIABLE e GET "${aout}" sub_group)
if(NOT rc EQUAL 0 OR e OR NOT asg EQUAL 458752)
  message(FATAL_ERROR "bench step --sub-group auto: ${rc} ${aout} ${err}")
endif()
execute_process(COMMAND ${CLI} bench step --params 2097152 --sub-group lots --runs 1
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "--sub-group 'lots'.*or auto")
  message(FATAL_ERROR "bench step --sub-group lots: ${rc} ${err}")
endif()
execute_process(COMMAND ${CLI} bench step --params 2097152 --state host --bf16-moments --runs 1
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "not with --state host")
  message(FATAL_ERROR "bench step --state host --bf16-moments: ${rc} ${err}")
endif()
execute_process(COMMAND ${CLI} residency --swap-dir ${sdir}/tierswap --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(JSON gen ERROR_VARIABLE e GET "${out}" generation committed)
if(NOT rc EQUAL 0 OR e OR gen LESS 3)
  message(FATAL_ERROR "residency of the kept bench step: ${rc} ${out} ${err}")
endif()
file(REMOVE_RECURSE "${sdir}")
file(MAKE_DIRECTORY "${sdir}")
execute_process(COMMAND ${CLI} bench step --params 2097152 --sub-group 262144 --host-budget 16MiB --runs 1
                        --dir ${sdir} --grad-tier nvme --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(JSON wr ERROR_VARIABLE e GET "${out}" nvme_write_bytes_per_param)
string(JSON rd ERROR_VARIABLE e2 GET "${out}" nvme_read_bytes_per_param)
file(GLOB left "${sdir}/*")
# 16-bit gradients on NVMe: 2 more bytes written per parameter (and read back, at most).
if(NOT rc EQUAL 0 OR e OR e2 OR NOT wr EQUAL 14 OR rd GREATER 14 OR left)
  message(FATAL_ERROR "bench step --grad-tier nvme: ${rc} written ${wr} read ${rd}, left: ${left} ${err}")
endif()
file(REMOVE_RECURSE "${sdir}")

# bench step --bf16-moments: the second stack writes 4 + 2 + 2 bytes per parameter and reads at
# most that (the budget may cache some), the first still writes 12, both are timed in every run,
# and nothing is left behind.
file(MAKE_DIRECTORY "${sdir}")
execute_process(COMMAND ${CLI} bench step --params 2097152 --sub-group 262144 --host-budget 16MiB --runs 2
                        --dir ${sdir} --bf16-moments --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(JSON bwr ERROR_VARIABLE e GET "${out}" bf16_moments_nvme_write_bytes_per_param)
string(JSON brd ERROR_VARIABLE e2 GET "${out}" bf16_moments_nvme_read_bytes_per_param)
string(JSON wr ERROR_VARIABLE e3 GET "${out}" nvme_write_bytes_per_param)
string(JSON ratio ERROR_VARIABLE e4 GET "${out}" runs 1 fp32_over_bf16_moments)
file(GLOB left "${sdir}/*")
if(NOT rc EQUAL 0 OR e OR e2 OR e3 OR e4 OR NOT bwr EQUAL 8 OR brd GREATER 8 OR NOT wr EQUAL 12
   OR NOT ratio GREATER 0 OR left)
  message(FATAL_ERROR "bench step --bf16-moments: ${rc} bf16 ${brd}/${bwr} fp32 written ${wr} "
                      "ratio ${ratio}, left: ${left} ${err}")
endif()
execute_process(COMMAND ${CLI} bench step --params 2097152 --overlap --bf16-moments
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "--bf16-moments")
  message(FATAL_ERROR "bench step --overlap --bf16-moments accepted or unclear: ${rc} ${err}")
endif()
file(REMOVE_RECURSE "${sdir}")

# bench step --overlap: every sub-group steps during the simulated backward, and the step left
# after the backward is shorter than the ordinary one (not a timing threshold: the overlapped
# step() does only the commit, the ordinary one all of the work).
file(MAKE_DIRECTORY "${sdir}")
execute_process(COMMAND ${CLI} bench step --params 2097152 --sub-group 262144 --host-budget 16MiB --runs 1
                        --dir ${sdir} --overlap --backward-ms 300 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(JSON kept ERROR_VARIABLE e GET "${out}" runs 0 overlapped_subgroups)
string(JSON nsub ERROR_VARIABLE e2 GET "${out}" subgroups)
string(JSON hidden ERROR_VARIABLE e3 GET "${out}" hidden_fraction)
file(GLOB left "${sdir}/*")
if(NOT rc EQUAL 0 OR e OR e2 OR e3 OR NOT kept EQUAL nsub OR NOT nsub EQUAL 8 OR left)
  message(FATAL_ERROR "bench step --overlap: ${rc} ${kept} of ${nsub} sub-groups, left: ${left} ${out} ${err}")
endif()
file(REMOVE_RECURSE "${sdir}")

# bench step --overlap --state host --memory-only: memory-only host state with undo copies (the
# budget holds them): every sub-group steps during the backward and nothing is written to NVMe;
# the same with the speculative 16-bit output in place.
foreach(inplace "" "--param16-in-place")
  file(MAKE_DIRECTORY "${sdir}")
  execute_process(COMMAND ${CLI} bench step --params 2097152 --sub-group 262144 --host-budget 256MiB
                          --runs 1 --dir ${sdir} --overlap --backward-ms 300 --state host
                          --memory-only ${inplace} --json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(JSON kept ERROR_VARIABLE e GET "${out}" runs 0 overlapped_subgroups)
  string(JSON nsub ERROR_VARIABLE e2 GET "${out}" subgroups)
  string(JSON wr ERROR_VARIABLE e3 GET "${out}" runs 0 nvme_write_bytes)
  string(JSON ip ERROR_VARIABLE e4 GET "${out}" param16_in_place)
  if(inplace)
    set(want_ip ON)
  else()
    set(want_ip OFF)
  endif()
  if(NOT rc EQUAL 0 OR e OR e2 OR e3 OR e4 OR NOT kept EQUAL nsub OR NOT wr EQUAL 0
     OR NOT ip STREQUAL want_ip)
    message(FATAL_ERROR "bench step --state host --memory-only ${inplace}: ${rc} ${kept} of ${nsub}, ${wr} B written, in place ${ip} ${out} ${err}")
  endif()
  file(REMOVE_RECURSE "${sdir}")
endforeach()

# plan: the issue's JSON schema on a shipped profile, and the text form.
execute_process(COMMAND ${CLI} plan --params 20B --profile gh200 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(JSON t ERROR_VARIABLE e GET "${out}" predicted_step_s)
string(JSON nv ERROR_VARIABLE e2 GET "${out}" bytes nvme)
string(JSON st ERROR_VARIABLE e3 GET "${out}" subgroups 0 state_tier)
string(JSON cast ERROR_VARIABLE e4 GET "${out}" subgroups 0 cast_on)
string(JSON mode ERROR_VARIABLE e5 GET "${out}" persist_resident_state)
string(JSON spec ERROR_VARIABLE e6 GET "${out}" subgroups 0 speculative)
if(NOT rc EQUAL 0 OR e OR e2 OR e3 OR e4 OR e5 OR e6 OR NOT nv EQUAL 0 OR NOT st STREQUAL "gpu"
   OR mode)
  message(FATAL_ERROR "plan --json: ${rc} ${err} ${out}")
endif()
# The persisted mode: resident state written to NVMe every step, two slots of it there.
execute_process(COMMAND ${CLI} plan --params 20B --profile gh200 --json --persist-resident-state
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(JSON mode ERROR_VARIABLE e GET "${out}" persist_resident_state)
string(JSON w ERROR_VARIABLE e2 GET "${out}" link_bytes_per_step nvme_write)
if(NOT rc EQUAL 0 OR e OR e2 OR NOT mode OR NOT w EQUAL 240000000000)
  message(FATAL_ERROR "plan --persist-resident-state: ${rc} ${err} ${mode} ${w}")
endif()
# Without overlap, the alternating order (default) reads less than --ascending, writes as much.
foreach(order alt asc)
  set(flag "")
  if(order STREQUAL "asc")
    set(flag "--ascending")
  endif()
  execute_process(COMMAND ${CLI} plan --params 70B --profile pcie4-workstation --no-overlap --json
                          ${flag}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(JSON r_${order} ERROR_VARIABLE e GET "${out}" link_bytes_per_step nvme_read)
  string(JSON w_${order} ERROR_VARIABLE e2 GET "${out}" link_bytes_per_step nvme_write)
  string(JSON o_${order} ERROR_VARIABLE e3 GET "${out}" alternate_step_order)
  if(NOT rc EQUAL 0 OR e OR e2 OR e3)
    message(FATAL_ERROR "plan --no-overlap ${flag}: ${rc} ${err} ${out}")
  endif()
endforeach()
if(r_alt STREQUAL r_asc OR NOT w_alt STREQUAL w_asc OR NOT o_alt OR o_asc)
  message(FATAL_ERROR "plan --ascending: NVMe read ${r_asc} / write ${w_asc}, alternating: "
                      "read ${r_alt} / write ${w_alt}; order recorded ${o_asc} / ${o_alt}")
endif()
execute_process(COMMAND ${CLI} plan --params 120B --profile pcie4-workstation
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "state nvme step cpu" OR NOT out MATCHES "predicted step")
  message(FATAL_ERROR "plan (text): ${rc} ${err} ${out}")
endif()

# probe, then plan on what it found (this machine; a CPU-only plan where there is no GPU).
set(pfile "${WORK}/probe.json")
execute_process(COMMAND ${CLI} probe --topology-only --out "${pfile}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT EXISTS "${pfile}")
  message(FATAL_ERROR "probe --out: ${rc} ${err} ${out}")
endif()
# A topology-only profile has no throughput figures: plan says which one is missing.
execute_process(COMMAND ${CLI} plan --params 100M --profile "${pfile}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "cpu_adam_gbps")
  message(FATAL_ERROR "plan on a topology-only profile: ${rc} ${err} ${out}")
endif()
file(MAKE_DIRECTORY "${WORK}/probe-nvme")
execute_process(COMMAND ${CLI} probe --nvme-dir "${WORK}/probe-nvme" --io-bytes 16MiB --threads 1
                        --out "${pfile}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT EXISTS "${pfile}")
  message(FATAL_ERROR "probe --nvme-dir: ${rc} ${err} ${out}")
endif()
file(REMOVE_RECURSE "${WORK}/probe-nvme")
execute_process(COMMAND ${CLI} plan --params 100M --profile "${pfile}" --backward-s 1
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "predicted step")
  message(FATAL_ERROR "plan on the probed profile: ${rc} ${err} ${out}")
endif()
file(REMOVE "${pfile}")

# demo --plan --overlap: a plan file with host and NVMe sub-groups, followed by the optimizer;
# every sub-group steps during the gradient ingest (no clipping to redo).
set(pfile "${WORK}/demo-plan.json")
file(WRITE "${pfile}" [=[{"format": "tierswap.plan", "version": 1, "subgroups": [
  {"numel": 1, "state_tier": "nvme", "step_device": "cpu"},
  {"numel": 1, "state_tier": "host", "step_device": "cpu"}]}]=])
execute_process(COMMAND ${CLI} demo --params 2097152 --sub-group 262144 --host-budget 16MiB --steps 2
                        --plan "${pfile}" --overlap --max-grad-norm 0 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(JSON n ERROR_VARIABLE e LENGTH "${out}" steps)
string(JSON kept ERROR_VARIABLE e2 GET "${out}" steps 1 overlapped_subgroups)
if(NOT rc EQUAL 0 OR e OR e2 OR NOT n EQUAL 2 OR kept LESS 1)
  message(FATAL_ERROR "demo --plan --overlap: ${rc} ${err} ${out}")
endif()
file(REMOVE "${pfile}")

# demo --plan with GPU sub-groups: a device tier sized for the plan (GPU memory, or a simulated
# tier standing in without a GPU), gradients handed over from device memory, the 16-bit
# parameters kept in a bound device copy that ends equal to param16(); with memory-only
# resident state nothing crosses between host and device after the first step.
file(WRITE "${pfile}" [=[{"format": "tierswap.plan", "version": 1,
  "persist_resident_state": false, "subgroups": [
  {"numel": 1, "state_tier": "host", "step_device": "cpu"},
  {"numel": 1, "state_tier": "gpu", "step_device": "gpu"}]}]=])
# The same run without a plan (state on NVMe, all on the CPU) ends with the same bits: the
# digests of the final state are equal.
execute_process(COMMAND ${CLI} demo --params 2097152 --sub-group 262144 --host-budget 64MiB --steps 3
                        --max-grad-norm 0 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE ref ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "demo without a plan: ${rc} ${err}")
endif()
foreach(overlap "" "--overlap")
  execute_process(COMMAND ${CLI} demo --params 2097152 --sub-group 262144 --host-budget 64MiB --steps 3
                          --plan "${pfile}" ${overlap} --max-grad-norm 0 --json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "demo --plan (GPU sub-groups) ${overlap}: ${rc} ${err} ${out}")
  endif()
  foreach(cls master exp_avg exp_avg_sq param16)
    string(JSON want GET "${ref}" digests ${cls})
    string(JSON got GET "${out}" digests ${cls})
    if(NOT want MATCHES "^[0-9a-f]+$" OR NOT got STREQUAL want)
      message(FATAL_ERROR "demo --plan (GPU sub-groups) ${overlap}: ${cls} digest ${got}, without a plan ${want}")
    endif()
  endforeach()
  string(JSON dev GET "${out}" device_tier)
  string(JSON dgrads GET "${out}" device_gradients)
  string(JSON d16 GET "${out}" param16_device_copy_matches)
  if(dev STREQUAL "off" OR NOT dgrads OR NOT d16)
    message(FATAL_ERROR "demo --plan (GPU sub-groups): device tier ${dev}, device gradients ${dgrads}, device copy of param16 matches ${d16}")
  endif()
  foreach(i 1 2)
    string(JSON up GET "${out}" steps ${i} device_in_bytes)
    string(JSON down GET "${out}" steps ${i} device_out_bytes)
    if(NOT up EQUAL 0 OR NOT down EQUAL 0)
      message(FATAL_ERROR "demo --plan (GPU sub-groups) ${overlap} step ${i}: ${up} B up, ${down} B down; expected none")
    endif()
  endforeach()
endforeach()
# TIERSWAP_DEVICE_TIER=simulated: the plan sizes the simulated tier (no TIERSWAP_DEVICE_BUDGET
# needed); without a plan or a budget the error names the missing capacity.
execute_process(COMMAND ${CMAKE_COMMAND} -E env TIERSWAP_DEVICE_TIER=simulated
                        ${CLI} demo --params 2097152 --sub-group 262144 --host-budget 64MiB --steps 2
                        --plan "${pfile}" --max-grad-norm 0 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(JSON dev ERROR_VARIABLE e GET "${out}" device_tier)
if(NOT rc EQUAL 0 OR e OR NOT dev STREQUAL "simulated")
  message(FATAL_ERROR "demo --plan with TIERSWAP_DEVICE_TIER=simulated: ${rc} ${err} ${out}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env TIERSWAP_DEVICE_TIER=simulated
                        ${CLI} demo --params 2097152 --sub-group 262144 --host-budget 64MiB --steps 1
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "device tier needs a capacity \\(TIERSWAP_DEVICE_BUDGET\\)")
  message(FATAL_ERROR "demo with TIERSWAP_DEVICE_TIER=simulated and no device budget: ${rc} ${err}")
endif()
execute_process(COMMAND ${CLI} demo --params 2M --plan "${pfile}" --device-budget banana
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "--device-budget")
  message(FATAL_ERROR "demo --device-budget banana: ${rc} ${err}")
endif()
file(REMOVE "${pfile}")

# bench kernels --device gpu: without a usable GPU, a clear error saying why.
execute_process(COMMAND ${CLI} info OUTPUT_VARIABLE info)
if(info MATCHES "GPU: none")
  execute_process(COMMAND ${CLI} bench kernels --device gpu --params 1M
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0 OR NOT err MATCHES "--device gpu: no usable GPU")
    message(FATAL_ERROR "bench kernels --device gpu without a GPU: ${rc} ${err}")
  endif()
endif()

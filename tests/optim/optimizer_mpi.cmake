# Multi-rank runs of the optimizer (tests/optim/optimizer_mpi_main.cpp) under mpirun:
#  - 1, 2, 3 and 4 ranks give bit-identical master weights and moments after 20 steps, and so
#    do 3 ranks reducing after every backward pass instead of once per step (no coalescing),
#    and 2 and 3 ranks with the overlapped step (with and without coalescing; 3 ranks also with
#    the speculative 16-bit output in place), and 3 ranks
#    taking gradients through add_grad_device with bound device copies of the 16-bit parameters
#    (a simulated device tier);
#  - a checkpoint saved at 3 ranks after step 10 resumes at 2 ranks to the same bits;
#  - 3 ranks stopped after step 4 with their swap files kept resume from them (resume()) to the
#    same bits, and so do 3 ranks of which only rank 0 committed step 5 (it steps back);
#  - 2 ranks of which the last one's reads fail in step 3 (in the pipeline; with the overlapped
#    step, in a speculative step), or its writes (the write-behind), both throw from that step
#    with neither stepped, and resume from step 2 to the same bits;
#  - 2 ranks (and 3, overlapped) of which the last one's commit of step 4 fails (its manifest
#    cannot be written) all throw from that step, the others undo their commit, and all redo
#    it and go on in the same processes to the same bits; without shadow slots (in place) the
#    commit cannot be undone, and every rank's step and next call say so;
#  - 2 ranks of which the last one's budget is refused at finalize() both throw from it; 2 ranks of
#    which the last one's writes fail in initialize() both throw, refuse to step, and initialize
#    again to the same bits; 2 ranks of which the last one's reads fail in a gather both throw
#    from it, and gather again to the same bits; and so do 2 ranks whose gradients' reduction
#    fails on the last one (reading a gradient it spilled), redoing the step;
#  - 3 ranks agree with torch.optim.AdamW (the fixture).
# Inputs: -DPROG= -DMPIEXEC= -DWORK= -DFIXTURE=
set(ENV{OMPI_ALLOW_RUN_AS_ROOT} 1)
set(ENV{OMPI_ALLOW_RUN_AS_ROOT_CONFIRM} 1)
set(ENV{OMPI_MCA_btl_vader_single_copy_mechanism} none)
set(ENV{OMPI_MCA_rmaps_base_oversubscribe} 1)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

function(run np)
  execute_process(COMMAND ${MPIEXEC} -np ${np} --oversubscribe ${PROG} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 600)
  message(STATUS "np=${np} ${ARGN}: ${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "mpirun -np ${np} failed (${rc})")
  endif()
endfunction()

run(1 --out ${WORK}/np1.bin)
run(2 --out ${WORK}/np2.bin)
run(3 --out ${WORK}/np3.bin --save-at 10 ${WORK}/ckpt3 --fixture ${FIXTURE})
run(4 --out ${WORK}/np4.bin)
run(3 --out ${WORK}/np3nc.bin --no-coalesce)
run(2 --out ${WORK}/np2ov.bin --overlap)
run(3 --out ${WORK}/np3ncov.bin --no-coalesce --overlap)
run(3 --out ${WORK}/np3dev.bin --device-grads)
run(3 --out ${WORK}/np3ovip.bin --overlap --param16-in-place)
run(2 --out ${WORK}/resume.bin --save-at 10 ${WORK}/ckpt3 --load ${WORK}/ckpt3)
run(3 --stop-at 4 ${WORK}/swap3)  # 3 ranks stop after step 4 keeping their swap files ...
run(3 --out ${WORK}/np3swap.bin --resume ${WORK}/swap3)  # ... and resume from them
run(3 --stop-at 5 ${WORK}/swap3lag)  # stopped after step 5, and ranks 1, 2 as if they had not
run(3 --out ${WORK}/np3lag.bin --resume-lagging ${WORK}/swap3lag)  # committed it: rank 0 steps back
run(2 --fail-io-at 3 read ${WORK}/swap2fail)  # rank 1's reads fail in step 3: no rank steps ...
run(2 --out ${WORK}/np2fail.bin --resume ${WORK}/swap2fail)  # ... and both resume after step 2
run(2 --overlap --fail-io-at 3 read ${WORK}/swap2ovfail)
run(2 --out ${WORK}/np2ovfail.bin --overlap --resume ${WORK}/swap2ovfail)
run(2 --fail-io-at 3 write ${WORK}/swap2wfail)  # its writes fail
run(2 --out ${WORK}/np2wfail.bin --resume ${WORK}/swap2wfail)
run(2 --out ${WORK}/np2cfail.bin --fail-commit-at 4)  # rank 1's commit of step 4 fails: both
run(3 --out ${WORK}/np3cfail.bin --overlap --fail-commit-at 4)  # redo it and go on
run(2 --out ${WORK}/unused.bin --in-place --fail-commit-at 4)  # without shadow slots rank 0
# cannot undo its commit: both ranks' step 4 and the next call say so
run(2 --out ${WORK}/unused.bin --refuse-finalize)  # rank 1's budget refused: both finalize()s throw
run(2 --out ${WORK}/np2ifail.bin --fail-init)  # rank 1's writes fail in initialize(): both throw,
# both refuse to step, and both initialize() again to the same bits
run(2 --out ${WORK}/np2gfail.bin --fail-gather)  # rank 1's reads fail in a gather: both throw
run(2 --out ${WORK}/np2rfail.bin --fail-reduce-at 3)  # ... in a reduction: both throw, redo step 3
foreach(f np2 np3 np4 np3nc np2ov np3ncov np3dev np3ovip resume np3swap np3lag np2fail np2ovfail np2wfail
        np2cfail np3cfail np2ifail np2gfail np2rfail)
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK}/np1.bin ${WORK}/${f}.bin
                  RESULT_VARIABLE same)
  if(NOT same EQUAL 0)
    message(FATAL_ERROR "${f}.bin differs from np1.bin: results depend on the world size")
  endif()
endforeach()
message(STATUS "1, 2, 3, 4 ranks, 3 ranks without coalescing, overlapped steps at 2 and 3 ranks, "
               "3 ranks with device gradients and a 3->2 rank resume: bit-identical")

# Installs the build into a temporary prefix and builds a consumer with find_package(tierswap).
set(prefix ${BUILD_DIR}/package-test/prefix)
set(cbuild ${BUILD_DIR}/package-test/consumer)
file(REMOVE_RECURSE ${BUILD_DIR}/package-test)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix}
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "install failed")
endif()
# Internal headers (include/tierswap/detail/) are not installed.
if(EXISTS ${prefix}/include/tierswap/detail)
  message(FATAL_ERROR "internal headers installed: ${prefix}/include/tierswap/detail")
endif()
# The consumer includes every installed public header (detail/ is internal), so each is checked
# to compile from the installed tree: a new header must be added to it.
file(GLOB headers RELATIVE ${prefix}/include ${prefix}/include/tierswap/*.hpp)
file(READ ${SRC_DIR}/package_consumer/main.cpp consumer)
foreach(h ${headers})
  string(FIND "${consumer}" "#include <${h}>" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "tests/package_consumer/main.cpp does not include the public header <${h}>")
  endif()
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC_DIR}/package_consumer -B ${cbuild}
                        -DCMAKE_PREFIX_PATH=${prefix} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the consumer failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${cbuild} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the consumer failed")
endif()
execute_process(COMMAND ${cbuild}/consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0 OR NOT out MATCHES "consumer ok")
  message(FATAL_ERROR "consumer failed: ${rc} ${out}")
endif()
# The Python package, when the module was built: importable from the installed tree alone.
if(PYTHON AND PYDIR)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env PYTHONPATH=${prefix}/${PYDIR}
                          ${PYTHON} -c "import tierswap.torch, tierswap._tierswap as n; print('python ok', n.__file__)"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "python ok ${prefix}")
    message(FATAL_ERROR "the installed Python package does not import: ${rc} ${out} ${err}")
  endif()
  # ... `tierswap config --from-deepspeed` finds it from the installed executable ...
  file(WRITE ${BUILD_DIR}/package-test/ds.json "{\"gradient_clipping\": 1.0}")
  execute_process(COMMAND ${prefix}/bin/tierswap config --from-deepspeed
                          ${BUILD_DIR}/package-test/ds.json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "max_grad_norm")
    message(FATAL_ERROR "installed `tierswap config --from-deepspeed`: ${rc} ${out} ${err}")
  endif()
  # ... and the interpreter looks there without PYTHONPATH under the usual prefixes (a default
  # `cmake --install build` goes to /usr/local; site.py adds those of them that exist).
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH ${PYTHON} -c
                          "import site; d = [p + '/${PYDIR}' for p in ('/usr/local', '/usr')]; m = [x for x in d if x not in site.getsitepackages()]; print(m or 'on the path')"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "^on the path")
    message(FATAL_ERROR "${PYTHON} does not look in ${out} (TIERSWAP_PYTHON_INSTALL_DIR=${PYDIR})")
  endif()
endif()

# Stages what cargo built as the artifacts this project ships (run with
# cmake -P by the te_stage target of CMakeLists.txt):
#
#   lib/libtransfer_engine.so.<VERSION>   the shared library, SONAME
#                                         libtransfer_engine.so.<MAJOR>
#   lib/libtransfer_engine.so.<MAJOR>     -> libtransfer_engine.so.<VERSION>
#   lib/libtransfer_engine.so             -> libtransfer_engine.so.<MAJOR>
#   lib/libtransfer_engine.a              the static library
#   lib/.debug/libtransfer_engine.so.<VERSION>.debug
#                                         the shared library's debug info
#   bin/transfer-engine-metadata-server   our HTTP metadata server
#   bin/transfer-engine-info              the diagnostic tool
#
# With SPLIT_DEBUG (the default) the shipped files carry no debug info: the
# shared library's goes to the .debug file, which its .gnu_debuglink names
# (gdb finds it there by itself); the static library and the tools keep
# their symbol tables only. Without SPLIT_DEBUG they are copied as built.
#
# Variables: CARGO_DIR (cargo's release directory), OUT_DIR, VERSION, MAJOR,
# SPLIT_DEBUG, OBJCOPY, STRIP.
foreach(v CARGO_DIR OUT_DIR VERSION MAJOR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "te_stage.cmake: ${v} is not set")
  endif()
endforeach()

set(lib "${OUT_DIR}/lib")
set(bin "${OUT_DIR}/bin")
set(real "libtransfer_engine.so.${VERSION}")
set(soname "libtransfer_engine.so.${MAJOR}")
file(MAKE_DIRECTORY "${lib}/.debug" "${bin}")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "te_stage.cmake: ${ARGN} failed (${rc}): ${err}")
  endif()
endfunction()

if(SPLIT_DEBUG)
  if(NOT OBJCOPY OR NOT STRIP)
    message(FATAL_ERROR "te_stage.cmake: objcopy and strip are needed to split debug info "
                        "(binutils), or configure with -DTE_SPLIT_DEBUG=OFF")
  endif()
  run("${OBJCOPY}" --only-keep-debug "${CARGO_DIR}/libtransfer_engine.so" "${lib}/.debug/${real}.debug")
  run("${STRIP}" --strip-debug --strip-unneeded -o "${lib}/${real}.tmp" "${CARGO_DIR}/libtransfer_engine.so")
  # The debuglink records the file name and a CRC of the debug file.
  run("${OBJCOPY}" "--add-gnu-debuglink=${lib}/.debug/${real}.debug" "${lib}/${real}.tmp")
  file(RENAME "${lib}/${real}.tmp" "${lib}/${real}")
  run("${STRIP}" --strip-debug -o "${lib}/libtransfer_engine.a" "${CARGO_DIR}/libtransfer_engine.a")
  foreach(tool transfer-engine-metadata-server transfer-engine-info)
    run("${STRIP}" --strip-debug -o "${bin}/${tool}" "${CARGO_DIR}/${tool}")
  endforeach()
else()
  file(REMOVE "${lib}/.debug/${real}.debug")
  run("${CMAKE_COMMAND}" -E copy "${CARGO_DIR}/libtransfer_engine.so" "${lib}/${real}")
  run("${CMAKE_COMMAND}" -E copy "${CARGO_DIR}/libtransfer_engine.a" "${lib}/libtransfer_engine.a")
  foreach(tool transfer-engine-metadata-server transfer-engine-info)
    run("${CMAKE_COMMAND}" -E copy "${CARGO_DIR}/${tool}" "${bin}/${tool}")
  endforeach()
endif()
file(CREATE_LINK "${real}" "${lib}/${soname}" SYMBOLIC)
file(CREATE_LINK "${soname}" "${lib}/libtransfer_engine.so" SYMBOLIC)

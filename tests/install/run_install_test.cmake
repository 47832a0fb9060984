# Installs the build into a scratch prefix, checks what was installed, then configures, builds and
# runs the consumer project (which checks the package's link closure for CUPTI).
file(REMOVE_RECURSE ${SPG_WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${SPG_BUILD_DIR} --prefix ${SPG_WORK_DIR}/prefix
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "install failed (${rc})")
endif()

# The library only: no test support, no CUPTI symbol in the archive.
file(GLOB_RECURSE spg_support_files RELATIVE ${SPG_WORK_DIR}/prefix
  ${SPG_WORK_DIR}/prefix/*allocation_counter* ${SPG_WORK_DIR}/prefix/*reference*
  ${SPG_WORK_DIR}/prefix/*synthetic_front* ${SPG_WORK_DIR}/prefix/*checksum* ${SPG_WORK_DIR}/prefix/*support*)
if(spg_support_files)
  message(FATAL_ERROR "test support was installed: ${spg_support_files}")
endif()
file(GLOB_RECURSE spg_archive ${SPG_WORK_DIR}/prefix/*/libspgraph.a)
if(NOT spg_archive)
  message(FATAL_ERROR "no libspgraph.a below ${SPG_WORK_DIR}/prefix")
endif()
execute_process(COMMAND ${SPG_NM} -u ${spg_archive} OUTPUT_VARIABLE spg_undefined RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${SPG_NM} -u ${spg_archive} failed (${rc})")
endif()
string(REGEX MATCHALL "[^\n]*cupti[^\n]*" spg_cupti_refs "${spg_undefined}")
if(spg_cupti_refs)
  message(FATAL_ERROR "the installed libspgraph.a calls CUPTI: ${spg_cupti_refs}")
endif()

execute_process(COMMAND ${CMAKE_COMMAND} -S ${SPG_CONSUMER_SOURCE} -B ${SPG_WORK_DIR}/build
  -DCMAKE_PREFIX_PATH=${SPG_WORK_DIR}/prefix RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer configure failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${SPG_WORK_DIR}/build RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer build failed (${rc})")
endif()
execute_process(COMMAND ${SPG_WORK_DIR}/build/consumer RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer run failed (${rc})")
endif()

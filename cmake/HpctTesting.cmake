# hpct_add_test(NAME SOURCES ... LIBS ... LABELS ... [RANKS n] [TIMEOUT s] [ARGS ...])
# A GoogleTest executable registered with CTest; RANKS > 0 launches it under mpiexec with n ranks.
function(hpct_add_test name)
  cmake_parse_arguments(T "" "RANKS;TIMEOUT" "SOURCES;LIBS;LABELS;ARGS" ${ARGN})
  if(NOT TARGET ${name})
    add_executable(${name} ${T_SOURCES})
    target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest hpct_warnings)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set(test_name ${name})
  if(T_RANKS)
    set(test_name ${name}_np${T_RANKS})
    add_test(NAME ${test_name}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${T_RANKS} --oversubscribe ${HPCT_MPIEXEC_EXTRA_FLAGS}
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}> ${T_ARGS})
    list(APPEND T_LABELS mpi)
  else()
    add_test(NAME ${test_name} COMMAND ${name} ${T_ARGS})
  endif()
  set_tests_properties(${test_name} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;HPCT_SOURCE_DIR=${PROJECT_SOURCE_DIR};HPCT_DATA_DIR=${HPCT_DATA_DIR}")
endfunction()

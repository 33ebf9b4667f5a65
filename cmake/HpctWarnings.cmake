# Warnings as an INTERFACE target our own code links PRIVATE (third-party headers stay quiet).
add_library(hpct_warnings INTERFACE)
target_compile_options(hpct_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
add_library(hpct_arch INTERFACE)
if(HPCT_NATIVE)
  target_compile_options(hpct_arch INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
endif()

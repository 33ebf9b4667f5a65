# Writes the hpctrain modulefile for one install prefix from modulefiles/hpctrain.tcl.in.
# Runs at install time (cmake/HpctInstall.cmake includes it from `cmake --install`, so the prefix is
# the one given there, --prefix included) and standalone, as the modules tests do:
#
#   cmake -DHPCT_MF_TEMPLATE=modulefiles/hpctrain.tcl.in -DHPCT_MF_OUTPUT=/opt/modulefiles/hpctrain/0.1.0 \
#         -DHPCT_MF_ROOT=/opt/hpctrain/0.1.0 -DHPCT_VERSION=0.1.0 [-DHPCT_MF_PREREQS="openmpi/4.1.4;hdf5/1.10"] \
#         -P modulefiles/render_modulefile.cmake
#
# Inputs: HPCT_MF_TEMPLATE, HPCT_MF_OUTPUT, HPCT_MF_ROOT, HPCT_VERSION (required); HPCT_MF_NAME
# (hpctrain), HPCT_MF_VERSION (HPCT_VERSION), HPCT_MF_COMPILER, HPCT_MF_MPI, HPCT_MF_PREREQS (a
# CMake list of modules to load first), HPCT_MF_LIBDIR (set when the libraries are shared: the
# directory under the root to put on LD_LIBRARY_PATH).
foreach(_v HPCT_MF_TEMPLATE HPCT_MF_OUTPUT HPCT_MF_ROOT HPCT_VERSION)
  if(NOT DEFINED ${_v} OR "${${_v}}" STREQUAL "")
    message(FATAL_ERROR "render_modulefile.cmake: ${_v} is not set")
  endif()
endforeach()
if(NOT HPCT_MF_NAME)
  set(HPCT_MF_NAME hpctrain)
endif()
if(NOT HPCT_MF_VERSION)
  set(HPCT_MF_VERSION ${HPCT_VERSION})
endif()
foreach(_v HPCT_MF_COMPILER HPCT_MF_MPI)
  if(NOT ${_v})
    set(${_v} "unknown")
  endif()
endforeach()

# The root goes into a Tcl double-quoted string: refuse what Tcl would substitute there rather than
# write a modulefile that loads the wrong path.
foreach(_c "\"" "$" "[" "]" "{" "}" "\\")
  string(FIND "${HPCT_MF_ROOT}" "${_c}" _at)
  if(NOT _at EQUAL -1)
    message(FATAL_ERROR "render_modulefile.cmake: the install prefix '${HPCT_MF_ROOT}' contains a character "
                      "Tcl would interpret (\" $ [ ] { } \\); install to a plain path")
  endif()
endforeach()
string(REGEX REPLACE "/+$" "" HPCT_MF_ROOT "${HPCT_MF_ROOT}")

set(HPCT_MF_PREREQ_BLOCK "")
foreach(_m IN LISTS HPCT_MF_PREREQS)
  string(STRIP "${_m}" _m)
  if(_m STREQUAL "")
    continue()
  endif()
  if(NOT _m MATCHES "^[A-Za-z0-9_.+/-]+$")
    message(FATAL_ERROR "render_modulefile.cmake: '${_m}' in HPCT_MODULE_PREREQS is not a module name")
  endif()
  # `module load` rather than `prereq`: Environment Modules 5 and Lmod both load it here and unload
  # it again with hpctrain; `prereq` is auto-loaded by the former only.
  string(APPEND HPCT_MF_PREREQ_BLOCK "module load ${_m}\n")
endforeach()

set(HPCT_MF_LIBRARY_BLOCK "")
if(HPCT_MF_LIBDIR)
  set(HPCT_MF_LIBRARY_BLOCK "prepend-path LD_LIBRARY_PATH $root/${HPCT_MF_LIBDIR}\n")
endif()

configure_file("${HPCT_MF_TEMPLATE}" "${HPCT_MF_OUTPUT}" @ONLY)

# What `cmake --install` puts under the prefix (docs/install.md):
#   bin/                      every app (each apps/*/CMakeLists.txt has its install(TARGETS))
#   lib/                      the hpct libraries, only when built shared (BUILD_SHARED_LIBS=ON)
#   share/hpctrain/slurm      job templates (slurm/*.sbatch, the chained example)
#   share/hpctrain/inputs     model shapes, ds_configs, health-check profiles
#   share/hpctrain/docs       README and docs/
#   <HPCT_MODULEFILE_DIR>/<HPCT_MODULE_NAME>/<HPCT_MODULE_VERSION>   the Tcl modulefile
# The modulefile is written at install time from modulefiles/hpctrain.tcl.in, so its paths are the
# prefix actually installed to (`cmake --install build --prefix /opt/...` included). Included
# before lib/ and apps/ so the install RPATH applies to their targets.
include(GNUInstallDirs)

# Spack-like version tag: <version>-<compiler>-<mpi>, e.g. 0.1.0-gcc-12.2.0-openmpi-4.1.4, so
# several builds of one release sit side by side under one module name.
string(TOLOWER "${CMAKE_CXX_COMPILER_ID}" _hpct_cc)
if(_hpct_cc STREQUAL "gnu")
  set(_hpct_cc gcc)
endif()
set(_hpct_compiler_tag "${_hpct_cc}-${CMAKE_CXX_COMPILER_VERSION}")
# The MPI from its mpi.h (FindMPI reports a library version string only when asked to).
set(_hpct_mpi_tag mpi)
find_file(_hpct_mpi_h mpi.h PATHS ${MPI_C_HEADER_DIR} ${MPI_CXX_HEADER_DIR} ${MPI_C_INCLUDE_DIRS} NO_DEFAULT_PATH)
if(_hpct_mpi_h)
  file(STRINGS "${_hpct_mpi_h}" _hpct_mpi_defs REGEX "^#define (OMPI_(MAJOR|MINOR|RELEASE)_VERSION|MPICH_VERSION|I_MPI_VERSION) ")
  if(_hpct_mpi_defs MATCHES "OMPI_MAJOR_VERSION ([0-9]+).*OMPI_MINOR_VERSION ([0-9]+).*OMPI_RELEASE_VERSION ([0-9]+)")
    set(_hpct_mpi_tag "openmpi-${CMAKE_MATCH_1}.${CMAKE_MATCH_2}.${CMAKE_MATCH_3}")
  elseif(_hpct_mpi_defs MATCHES "I_MPI_VERSION \"([0-9.]+)")
    set(_hpct_mpi_tag "impi-${CMAKE_MATCH_1}")
  elseif(_hpct_mpi_defs MATCHES "MPICH_VERSION \"([0-9.]+)")
    set(_hpct_mpi_tag "mpich-${CMAKE_MATCH_1}")
  endif()
endif()
unset(_hpct_mpi_h CACHE)

set(HPCT_MODULE_NAME "hpctrain" CACHE STRING "Module name of the installed modulefile")
set(HPCT_MODULE_VERSION "" CACHE STRING
  "Module version (module load hpctrain/<this>); empty: <version>-<compiler>-<mpi> of this build")
set(HPCT_MODULE_PREREQS "" CACHE STRING
  "Modules the modulefile loads first: the site's MPI/HDF5 this build used, e.g. 'openmpi/4.1.4;hdf5/1.10.8'. Empty: none")
set(HPCT_MODULEFILE_DIR "modulefiles" CACHE STRING
  "Module tree the modulefile goes into: relative to the install prefix, or absolute (a site's MODULEPATH entry)")

set(_hpct_module_version "${HPCT_MODULE_VERSION}")
if(NOT _hpct_module_version)
  set(_hpct_module_version "${PROJECT_VERSION}-${_hpct_compiler_tag}-${_hpct_mpi_tag}")
endif()

# Installed binaries keep the run path to the libraries they were linked against outside the build
# tree (a site's CUDA, NCCL, MPI, HDF5 from modules), as Spack builds do: they start without
# LD_LIBRARY_PATH.
if(NOT DEFINED CMAKE_INSTALL_RPATH_USE_LINK_PATH)
  set(CMAKE_INSTALL_RPATH_USE_LINK_PATH ON)
endif()
# Shared libraries: installed to lib/ and found by RPATH (LD_LIBRARY_PATH in the modulefile too,
# for tools that dlopen). Static (the default): nothing is needed at run time.
set(_hpct_module_libdir "")
if(BUILD_SHARED_LIBS)
  set(_hpct_module_libdir "${CMAKE_INSTALL_LIBDIR}")
  if(NOT DEFINED CMAKE_INSTALL_RPATH)
    set(CMAKE_INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
  endif()
endif()

install(DIRECTORY ${PROJECT_SOURCE_DIR}/slurm/ DESTINATION ${CMAKE_INSTALL_DATADIR}/hpctrain/slurm
  FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE
  FILES_MATCHING PATTERN "*.sbatch" PATTERN "*.sh")
install(FILES ${PROJECT_SOURCE_DIR}/slurm/README.md DESTINATION ${CMAKE_INSTALL_DATADIR}/hpctrain/slurm)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/inputs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/hpctrain/inputs)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/hpctrain/docs
  FILES_MATCHING PATTERN "*.md")
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DATADIR}/hpctrain/docs)

# The modulefile, rendered at install time. Everything known now is baked into the install script;
# the prefix is read there, so `cmake --install --prefix` and DESTDIR staging get it right.
install(CODE "
  set(HPCT_MF_TEMPLATE [[${PROJECT_SOURCE_DIR}/modulefiles/hpctrain.tcl.in]])
  set(HPCT_VERSION [[${PROJECT_VERSION}]])
  set(HPCT_MF_NAME [[${HPCT_MODULE_NAME}]])
  set(HPCT_MF_VERSION [[${_hpct_module_version}]])
  set(HPCT_MF_COMPILER [[${_hpct_compiler_tag}]])
  set(HPCT_MF_MPI [[${_hpct_mpi_tag}]])
  set(HPCT_MF_PREREQS [[${HPCT_MODULE_PREREQS}]])
  set(HPCT_MF_LIBDIR [[${_hpct_module_libdir}]])
  set(HPCT_MF_ROOT \"\${CMAKE_INSTALL_PREFIX}\")
  set(_hpct_mf_dir [[${HPCT_MODULEFILE_DIR}]])
  if(NOT IS_ABSOLUTE \"\${_hpct_mf_dir}\")
    set(_hpct_mf_dir \"\${CMAKE_INSTALL_PREFIX}/\${_hpct_mf_dir}\")
  endif()
  set(HPCT_MF_OUTPUT \"\$ENV{DESTDIR}\${_hpct_mf_dir}/\${HPCT_MF_NAME}/\${HPCT_MF_VERSION}\")
  message(STATUS \"Installing modulefile: \${HPCT_MF_OUTPUT}\")
  include([[${PROJECT_SOURCE_DIR}/modulefiles/render_modulefile.cmake]])
")

# Shared hpct libraries are installed once every target exists (lib/ is added after this file).
function(_hpct_install_shared_libraries)
  foreach(_m core comm io kernels model parallel engine)
    if(TARGET hpct_${_m})
      get_target_property(_type hpct_${_m} TYPE)
      if(_type STREQUAL "SHARED_LIBRARY")
        install(TARGETS hpct_${_m} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
      endif()
    endif()
  endforeach()
endfunction()
cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL _hpct_install_shared_libraries)

message(STATUS "hpctrain modulefile: ${HPCT_MODULEFILE_DIR}/${HPCT_MODULE_NAME}/${_hpct_module_version}"
               " (prereqs: ${HPCT_MODULE_PREREQS})")

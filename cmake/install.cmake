# Installation: the header, the static and shared library (versioned soname,
# only the ql_* functions of the public header exported), the qlinear tool, a
# pkg-config file, a CMake package (find_package(qlinear) -> qlinear::qlinear)
# and the Python package. Included at the end of the top-level CMakeLists.txt.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# One version: the header's QL_VERSION_* must agree with project().
file(STRINGS "${CMAKE_SOURCE_DIR}/include/qlinear.h" _ql_ver REGEX "^#define QL_VERSION_(MAJOR|MINOR|PATCH) ")
string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+).*" "\\1.\\2.\\3" _ql_hver "${_ql_ver}")
if(NOT _ql_hver STREQUAL PROJECT_VERSION)
  message(FATAL_ERROR "include/qlinear.h says version ${_ql_hver}, CMakeLists.txt says ${PROJECT_VERSION}")
endif()
target_compile_definitions(qlinear_objs PRIVATE QL_VERSION_STRING="${PROJECT_VERSION}")

# 0.x releases may break the ABI at every minor version: soname libqlinear.so.0.1.
set(QL_SOVERSION "${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}")
if(PROJECT_VERSION_MAJOR GREATER 0)
  set(QL_SOVERSION "${PROJECT_VERSION_MAJOR}")
endif()
set_target_properties(qlinear_shared PROPERTIES VERSION "${PROJECT_VERSION}" SOVERSION "${QL_SOVERSION}"
  EXPORT_NAME qlinear)
set_target_properties(qlinear_static PROPERTIES EXPORT_NAME qlinear_static)
foreach(t qlinear_static qlinear_shared)
  target_include_directories(${t} INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
endforeach()

# Export list made from the header's declarations, so the shared library's ABI
# is the header and nothing else (internal helpers stay local).
file(READ "${CMAKE_SOURCE_DIR}/include/qlinear.h" _ql_h)
string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" "" _ql_h "${_ql_h}")
string(REGEX MATCHALL "[ *]ql_[a-z0-9_]+\\(" _ql_fns "${_ql_h}")
list(TRANSFORM _ql_fns REPLACE "^[ *](.*)\\($" "\\1")
list(REMOVE_DUPLICATES _ql_fns)
list(JOIN _ql_fns ";\n    " _ql_fns)
set(QL_VERSION_SCRIPT "${CMAKE_BINARY_DIR}/qlinear.map")
file(CONFIGURE OUTPUT "${QL_VERSION_SCRIPT}" CONTENT "QLINEAR_${QL_SOVERSION} {\n  global:\n    ${_ql_fns};\n  local: *;\n};\n")
target_link_options(qlinear_shared PRIVATE "LINKER:--version-script=${QL_VERSION_SCRIPT}")
set_property(TARGET qlinear_shared APPEND PROPERTY LINK_DEPENDS "${QL_VERSION_SCRIPT}")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/include/qlinear.h")

install(FILES include/qlinear.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS qlinear_shared qlinear_static EXPORT qlinearTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS qlinear RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(QL_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/qlinear")
install(EXPORT qlinearTargets NAMESPACE qlinear:: DESTINATION "${QL_CMAKE_DIR}")
configure_package_config_file(cmake/qlinearConfig.cmake.in "${CMAKE_BINARY_DIR}/qlinearConfig.cmake"
  INSTALL_DESTINATION "${QL_CMAKE_DIR}")
write_basic_package_version_file("${CMAKE_BINARY_DIR}/qlinearConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_BINARY_DIR}/qlinearConfig.cmake" "${CMAKE_BINARY_DIR}/qlinearConfigVersion.cmake"
  DESTINATION "${QL_CMAKE_DIR}")

# pkg-config: the shared library by default, `--static` adds what libqlinear.a needs.
# Paths relative to the .pc file, so the tree can be installed to any prefix.
file(RELATIVE_PATH QL_PC_PREFIX_REL "/P/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/P")
configure_file(cmake/qlinear.pc.in "${CMAKE_BINARY_DIR}/qlinear.pc" @ONLY)
install(FILES "${CMAKE_BINARY_DIR}/qlinear.pc" DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig")

# Python package (pure Python over libqlinear): lib/python3/dist-packages is on
# Debian's /usr/bin/python3 path for the /usr/local prefix; it finds the
# library at <prefix>/lib*/ from there.
set(QL_PY_DIR "lib/python3/dist-packages")
file(RELATIVE_PATH _ql_py_lib "/P/${QL_PY_DIR}/qlinear" "/P/${CMAKE_INSTALL_LIBDIR}/libqlinear.so.${QL_SOVERSION}")
file(RELATIVE_PATH _ql_py_h "/P/${QL_PY_DIR}/qlinear" "/P/${CMAKE_INSTALL_INCLUDEDIR}/qlinear.h")
file(CONFIGURE OUTPUT "${CMAKE_BINARY_DIR}/_installed.py" CONTENT
  "# Written by cmake --install: where this tree's library and header are, from this folder.\nLIBRARY = \"${_ql_py_lib}\"\nHEADER = \"${_ql_py_h}\"\n")
install(DIRECTORY python/qlinear DESTINATION "${QL_PY_DIR}" PATTERN "__pycache__" EXCLUDE)
install(FILES "${CMAKE_BINARY_DIR}/_installed.py" DESTINATION "${QL_PY_DIR}/qlinear")

# The installed tree, used by a C program with pkg-config and with CMake
# (tests/install_test.sh; not under sanitizers, whose runtime consumers lack).
if(QL_BUILD_TESTS AND NOT QL_SANITIZE)
  add_test(NAME test_install COMMAND bash "${CMAKE_SOURCE_DIR}/tests/install_test.sh" "${CMAKE_BINARY_DIR}"
    "${CMAKE_SOURCE_DIR}")
  set_tests_properties(test_install PROPERTIES TIMEOUT 600)
endif()

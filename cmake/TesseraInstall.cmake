# Install rules: libraries, public headers, binaries, the CMake package and tessera.pc.
#
#   cmake --install build --prefix /opt/tessera
#   find_package(Tessera 0.1 REQUIRED)        # CMAKE_PREFIX_PATH=/opt/tessera
#   target_link_libraries(app PRIVATE tessera::client)
#   pkg-config --cflags --libs tessera        # PKG_CONFIG_PATH=/opt/tessera/lib/pkgconfig
#
# Code includes <tessera/client.h> (and <tessera/export_reader.h>, <tessera/status.h>,
# <tessera/table_spec.h>, <tessera/server.h>) with PREFIX/include as the include root. These
# forwarding headers (tessera/*.h in the tree) include the public headers, which keep their
# place under include/tessera/ (include/tessera/ps/client/client.h, ...) and include each other
# as in the tree ("ps/status.h"): so the package and tessera.pc also put PREFIX/include/tessera
# on the path. User code including "ps/client/client.h" that way is deprecated and keeps
# compiling for the 0.1 releases. Internal headers (*_internal.h) and test helpers are not
# installed.
include(CMakePackageConfigHelpers)

set(TESSERA_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/Tessera)
set(TESSERA_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/tessera)

# ---- what this configure built
set(_tessera_targets tessera_ps tessera_client)
set(_tessera_bins)
foreach(t tessera-ctl tessera-server tessera-worker tessera-lookup)
  if(TARGET ${t})
    list(APPEND _tessera_bins ${t})
  endif()
endforeach()
if(TARGET tessera_server)
  list(APPEND _tessera_targets tessera_storage tessera_metrics tessera_server)
endif()
if(TARGET tessera_worker)
  list(APPEND _tessera_targets tessera_worker)
endif()

install(TARGETS ${_tessera_targets} EXPORT TesseraTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(_tessera_bins)
  install(TARGETS ${_tessera_bins} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
# tessera-server links tessera_coord (--coordinator); it is no exported target (no program
# outside the tree uses it yet), but a shared build's binary needs the library beside the others.
if(TARGET tessera_coord)
  get_target_property(_tessera_coord_type tessera_coord TYPE)
  if(_tessera_coord_type STREQUAL "SHARED_LIBRARY")
    install(TARGETS tessera_coord LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  endif()
endif()

# ---- public headers, module by module
# tessera_install_headers(DIR [SUBDIR...]): DIR's public headers, without its SUBDIRs.
function(tessera_install_headers dir)
  set(skip)
  foreach(sub ${ARGN})
    list(APPEND skip PATTERN ${sub} EXCLUDE)
  endforeach()
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${TESSERA_INSTALL_INCLUDEDIR}/${dir}
          FILES_MATCHING PATTERN "*.h"
          PATTERN "*_internal.h" EXCLUDE
          PATTERN "*_test_util.h" EXCLUDE
          ${skip})
endfunction()
# the core: status, table specs, routing (ps/coord and ps/control are not installed yet: no
# program outside the tree uses tessera_coord or tessera_control)
tessera_install_headers(ps client server metrics coord control)
tessera_install_headers(ps/client)   # Client, ExportReader
# <tessera/client.h> and the other forwarding headers (server.h only where the server is built).
install(FILES ${PROJECT_SOURCE_DIR}/tessera/client.h
              ${PROJECT_SOURCE_DIR}/tessera/export_reader.h
              ${PROJECT_SOURCE_DIR}/tessera/status.h
              ${PROJECT_SOURCE_DIR}/tessera/table_spec.h
        DESTINATION ${TESSERA_INSTALL_INCLUDEDIR})
if(TARGET tessera_server)
  install(FILES ${PROJECT_SOURCE_DIR}/tessera/server.h
          DESTINATION ${TESSERA_INSTALL_INCLUDEDIR})
  tessera_install_headers(ps/server) # Server (embedding a shard in a process)
  tessera_install_headers(ps/metrics)
  tessera_install_headers(storage)
endif()
if(TARGET tessera_worker)
  tessera_install_headers(worker)
endif()

# ---- the CMake package
set(TESSERA_PACKAGE_HAS_SERVER OFF)
set(TESSERA_PACKAGE_HAS_WORKER OFF)
if(TARGET tessera_server)
  set(TESSERA_PACKAGE_HAS_SERVER ON)
endif()
if(TARGET tessera_worker)
  set(TESSERA_PACKAGE_HAS_WORKER ON)
endif()
install(EXPORT TesseraTargets NAMESPACE tessera:: DESTINATION ${TESSERA_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/TesseraConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/TesseraConfig.cmake
                              INSTALL_DESTINATION ${TESSERA_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/TesseraConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/TesseraConfig.cmake
              ${PROJECT_BINARY_DIR}/TesseraConfigVersion.cmake
        DESTINATION ${TESSERA_INSTALL_CMAKEDIR})

# ---- pkg-config: the client library. Static libraries carry their dependencies in Libs and
# Requires (plain `pkg-config --libs` must link); shared ones only in the .private fields.
get_target_property(_tessera_client_type tessera_client TYPE)
set(TESSERA_PC_REQUIRES "libzmq libxxhash")
set(TESSERA_PC_ABSL "absl_flat_hash_map absl_hash absl_raw_hash_set")
if(_tessera_client_type STREQUAL "STATIC_LIBRARY")
  set(TESSERA_PC_REQUIRES_FIELD "Requires: ${TESSERA_PC_REQUIRES} ${TESSERA_PC_ABSL}")
  set(TESSERA_PC_LIBS_PRIVATE "-pthread")
  set(TESSERA_PC_LIBS_EXTRA "-pthread")
  set(TESSERA_PC_REQUIRES_PRIVATE_FIELD "")
else()
  set(TESSERA_PC_REQUIRES_FIELD "Requires: ${TESSERA_PC_REQUIRES}")
  set(TESSERA_PC_REQUIRES_PRIVATE_FIELD "Requires.private: ${TESSERA_PC_ABSL}")
  set(TESSERA_PC_LIBS_EXTRA "")
  set(TESSERA_PC_LIBS_PRIVATE "-pthread")
endif()
file(RELATIVE_PATH TESSERA_PC_UP /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
configure_file(${PROJECT_SOURCE_DIR}/cmake/tessera.pc.in ${PROJECT_BINARY_DIR}/tessera.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/tessera.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# ---- the Python package, where it was built: PREFIX/lib/python3/dist-packages/tessera (Debian's
# layout; PYTHONPATH=PREFIX/lib/python3/dist-packages elsewhere).
if(TARGET tessera_python)
  install(TARGETS tessera_python LIBRARY DESTINATION lib/python3/dist-packages/tessera)
  foreach(f ${TESSERA_PYTHON_FILES})
    install(FILES ${PROJECT_SOURCE_DIR}/python/tessera/${f}
            DESTINATION lib/python3/dist-packages/tessera)
  endforeach()
endif()

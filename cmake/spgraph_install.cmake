# Install the library, its headers and a CMake package so that find_package(spgraph CONFIG) works.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS spgraph EXPORT spgraphTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
# The public headers only (cmake/spgraph_headers.cmake), each at its path below the include root.
foreach(header IN LISTS SPGRAPH_PUBLIC_HEADERS)
  get_filename_component(dir ${header} DIRECTORY)
  install(FILES src/${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${dir})
endforeach()
install(EXPORT spgraphTargets NAMESPACE spgraph:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/spgraph)
# The build tree is a package too: find_package(spgraph) with spgraph_DIR=<build dir> links the
# library built there (the Python extension in python/ builds this way, without a second build of
# the kernels). Its paths are absolute; to move a build to another machine, install it instead.
export(EXPORT spgraphTargets NAMESPACE spgraph:: FILE ${PROJECT_BINARY_DIR}/spgraphTargets.cmake)
# The build tree also exports the test and sample support (spgraph::support), which is never
# installed: the config file loads it when present.
export(TARGETS spgraph_support NAMESPACE spgraph:: FILE ${PROJECT_BINARY_DIR}/spgraphSupportTargets.cmake)
configure_package_config_file(cmake/spgraphConfig.cmake.in
  ${PROJECT_BINARY_DIR}/spgraphConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/spgraph)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/spgraphConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/spgraphConfig.cmake ${PROJECT_BINARY_DIR}/spgraphConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/spgraph)

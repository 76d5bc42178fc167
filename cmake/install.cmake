# `cmake --install` gives headers, the library and a package config, so that
# find_package(cuflash) + target_link_libraries(app cuflash::cuflash) works.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS cuflash EXPORT cuflashTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/cuflash DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET cuflash_cli)
  # The installed command finds the installed library beside it.
  set_target_properties(cuflash_cli PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
  install(TARGETS cuflash_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(CUFLASH_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/cuflash)
install(EXPORT cuflashTargets NAMESPACE cuflash:: DESTINATION ${CUFLASH_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/cuflashConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/cuflashConfig.cmake
                              INSTALL_DESTINATION ${CUFLASH_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cuflashConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cuflashConfig.cmake ${PROJECT_BINARY_DIR}/cuflashConfigVersion.cmake
        DESTINATION ${CUFLASH_CMAKE_DIR})

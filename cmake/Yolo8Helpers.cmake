# Shared build settings for every target of the project.
find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  # The settings travel with every compile (an environment variable set at configure time would not):
  # PCH users are cacheable only with this sloppiness, and BASEDIR makes a fresh clone in another folder
  # (CI) hit the cache that an earlier build filled.
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env
      "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      "CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}" ${CCACHE_PROGRAM})
endif()

set(YOLO8_WARNINGS -Wall -Wextra -Wshadow)

# -DYOLO8_SANITIZE=address,undefined or =thread (scripts/sanitize.sh): every target of this build, tests included.
set(YOLO8_SANITIZE "" CACHE STRING "Sanitizers for every target: address,undefined or thread (empty: none)")
if(YOLO8_SANITIZE)
  add_compile_options(-fsanitize=${YOLO8_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=${YOLO8_SANITIZE})
endif()

# yolo8_library(NAME SOURCES ... [TORCH])
#   A project library with warnings on; TORCH adds LibTorch and its precompiled header.
function(yolo8_library name)
  cmake_parse_arguments(ARG "TORCH" "" "SOURCES" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_compile_options(${name} PRIVATE ${YOLO8_WARNINGS})
  if(ARG_TORCH)
    yolo8_use_torch(${name})
  endif()
endfunction()

# Links LibTorch and reuses one precompiled <torch/torch.h> across targets.
function(yolo8_use_torch target)
  target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES})
  target_compile_options(${target} PRIVATE ${TORCH_CXX_FLAGS_LIST})
  target_precompile_headers(${target} REUSE_FROM yolo8_torch_pch)
endfunction()

# yolo8_test(NAME LABEL LABEL... SOURCES ... LIBS ...)
#   One GoogleTest executable; each TEST becomes a CTest test carrying LABEL (unit, golden, integration) and any
#   further labels (a scenario's name, e.g. lease_scenario, for `ctest -L`).
function(yolo8_test name)
  cmake_parse_arguments(ARG "NO_TORCH" "" "LABEL;SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE ${YOLO8_WARNINGS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/tests)
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gmock GTest::gtest_main)
  if(NOT ARG_NO_TORCH)
    yolo8_use_torch(${name})
  endif()
  list(GET ARG_LABEL 0 first_label)
  # Dataset indexes and other derived files go to the build folder, not the user's ~/.cache.
  gtest_discover_tests(${name}
    PROPERTIES LABELS ${first_label} ENVIRONMENT "YOLO8_CACHE_DIR=${PROJECT_BINARY_DIR}/test-cache"
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
    DISCOVERY_MODE PRE_TEST
    DISCOVERY_TIMEOUT 60)
  # gtest_discover_tests splits a list-valued property into words, so every label is set after the discovery,
  # on the list of tests it leaves in ${name}_TESTS (CTest reads the include files in order).
  list(LENGTH ARG_LABEL label_count)
  if(label_count GREATER 1)
    set(labels_file ${CMAKE_CURRENT_BINARY_DIR}/${name}_labels.cmake)
    file(WRITE ${labels_file}
         "if(${name}_TESTS)\n  set_tests_properties(\${${name}_TESTS} PROPERTIES LABELS \"${ARG_LABEL}\")\nendif()\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${labels_file})
  endif()
endfunction()

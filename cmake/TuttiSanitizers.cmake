# Sanitizer and fuzzing builds, each in its own build tree:
#   -DTUTTI_SANITIZE=address  AddressSanitizer + UndefinedBehaviorSanitizer (any UB is fatal)
#   -DTUTTI_SANITIZE=thread   ThreadSanitizer
#   -DTUTTI_FUZZ=ON           the libFuzzer targets in fuzz/ (clang): every target is
#                             compiled with coverage instrumentation for them
# Without TUTTI_FUZZ the fuzz targets are still built, as replay programs that
# run the seed corpus and the regression inputs under CTest.
set(TUTTI_SANITIZE "" CACHE STRING "Sanitizer build: empty, address (ASan+UBSan) or thread (TSan)")
set_property(CACHE TUTTI_SANITIZE PROPERTY STRINGS "" address thread)
option(TUTTI_FUZZ "Build the fuzz targets with libFuzzer (needs clang)" OFF)

set(TUTTI_SANITIZER_FLAGS)
if(TUTTI_SANITIZE STREQUAL "address")
  set(TUTTI_SANITIZER_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all
    -fno-omit-frame-pointer)
elseif(TUTTI_SANITIZE STREQUAL "thread")
  set(TUTTI_SANITIZER_FLAGS -fsanitize=thread -fno-omit-frame-pointer)
elseif(NOT TUTTI_SANITIZE STREQUAL "")
  message(FATAL_ERROR "TUTTI_SANITIZE='${TUTTI_SANITIZE}': use address, thread or leave it empty")
endif()
if(TUTTI_SANITIZER_FLAGS)
  add_compile_options(${TUTTI_SANITIZER_FLAGS})
  add_link_options(${TUTTI_SANITIZER_FLAGS})
  message(STATUS "tutti: sanitizer build (${TUTTI_SANITIZE}): ${TUTTI_SANITIZER_FLAGS}")
  # The interpreter is not instrumented: a sanitized extension module cannot
  # be loaded into it. The binding's tests run in the regular build.
  if(TUTTI_WITH_PYTHON)
    message(STATUS "tutti: Python binding not built in a sanitizer build")
    set(TUTTI_WITH_PYTHON OFF)
  endif()
endif()
# What every program of a sanitizer build links first (tutti_sanitize_programs
# below): the ASan/UBSan runtime options and leak suppressions; for TSan, the
# annotations that make abseil's synchronisation visible to it (Debian's
# libabsl_synchronization is not built with TSan) and TSan's options.
set(TUTTI_SANITIZER_SUPPORT)
if(TUTTI_SANITIZE STREQUAL "address")
  add_library(tutti_sanitizer_defaults OBJECT
    ${CMAKE_CURRENT_LIST_DIR}/sanitizers/sanitizer_defaults.cc)
  list(APPEND TUTTI_SANITIZER_SUPPORT tutti_sanitizer_defaults)
elseif(TUTTI_SANITIZE STREQUAL "thread")
  # tsan_grpc.cc needs gRPC's headers only: programs without gRPC never
  # look its functions up.
  add_library(tutti_tsan_support OBJECT
    ${CMAKE_CURRENT_LIST_DIR}/sanitizers/tsan_absl_sync.cc
    ${CMAKE_CURRENT_LIST_DIR}/sanitizers/tsan_grpc.cc
    ${CMAKE_CURRENT_LIST_DIR}/sanitizers/tsan_defaults.cc)
  target_include_directories(tutti_tsan_support PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(tutti_tsan_support PUBLIC absl::synchronization absl::status
    absl::time ${CMAKE_DL_LIBS})
  list(APPEND TUTTI_SANITIZER_SUPPORT tutti_tsan_support)
endif()

# tutti-tsan-check <case>: TSan orders what abseil orders and still reports
# what nothing orders (each case a test; the racy ones must be reported).
function(tutti_tsan_checks)
  if(NOT TUTTI_SANITIZE STREQUAL "thread" OR NOT TUTTI_BUILD_TESTS)
    return()
  endif()
  add_executable(tutti-tsan-check ${PROJECT_SOURCE_DIR}/cmake/sanitizers/tsan_check.cc)
  target_link_libraries(tutti-tsan-check PRIVATE absl::synchronization absl::time Threads::Threads)
  foreach(c mutex reader_lock lock_when await_condvar try_lock notification counter_barrier)
    add_test(NAME tsan_check.orders.${c} COMMAND tutti-tsan-check ${c})
    set_tests_properties(tsan_check.orders.${c} PROPERTIES LABELS tsan TIMEOUT 120
      PASS_REGULAR_EXPRESSION "${c}: done" FAIL_REGULAR_EXPRESSION "ThreadSanitizer")
  endforeach()
  foreach(c race_unprotected race_two_mutexes race_after_notify race_memcpy)
    add_test(NAME tsan_check.reports.${c} COMMAND tutti-tsan-check ${c})
    set_tests_properties(tsan_check.reports.${c} PROPERTIES LABELS tsan TIMEOUT 120
      PASS_REGULAR_EXPRESSION "WARNING: ThreadSanitizer: data race")
  endforeach()
endfunction()

# Links TUTTI_SANITIZER_SUPPORT ahead of everything else into every
# executable defined under `dir` (call it once, after all subdirectories).
function(tutti_sanitize_programs dir)
  if(NOT TUTTI_SANITIZER_SUPPORT)
    return()
  endif()
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(type STREQUAL "EXECUTABLE")
      get_target_property(libs ${t} LINK_LIBRARIES)
      if(NOT libs)
        set(libs)
      endif()
      set_property(TARGET ${t} PROPERTY LINK_LIBRARIES ${TUTTI_SANITIZER_SUPPORT} ${libs})
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(d IN LISTS subdirs)
    tutti_sanitize_programs(${d})
  endforeach()
endfunction()
if(TUTTI_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "TUTTI_FUZZ needs clang (libFuzzer): configure with "
      "-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

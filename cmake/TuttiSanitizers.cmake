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
endif()
if(TUTTI_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "TUTTI_FUZZ needs clang (libFuzzer): configure with "
      "-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

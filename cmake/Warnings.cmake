# tierkv_warnings: the warning set every first-party target builds with.
add_library(tierkv_warnings INTERFACE)
target_compile_options(tierkv_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-missing-field-initializers>)
# Clang proves the locking of every annotated Mutex (common/mutex.h,
# STYLE.md habit 10); a violation fails the build. GCC has no such analysis
# (the annotations expand to nothing there).
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  target_compile_options(tierkv_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety -Werror=thread-safety>)
endif()

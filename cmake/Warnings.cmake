# tierkv_warnings: the warning set every first-party target builds with.
add_library(tierkv_warnings INTERFACE)
target_compile_options(tierkv_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-missing-field-initializers>)

# cmake -DREADME=<README.md> -DPROJECT_DIR=<install_project> -P readme_examples.cmake
# Fails unless the README's C++ examples (the code blocks under "### The local client API" and
# "### An engine's paged KV cache") and C example (under "### From C") appear verbatim in
# install_project's local_client_example.cpp, engine_example.cpp and engine_example.c, which
# install_test.cmake builds against the installed tree.
file(READ ${README} readme)

function(check_block heading fence file)
  string(FIND "${readme}" "${heading}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "README.md has no heading '${heading}'")
  endif()
  string(SUBSTRING "${readme}" ${at} -1 rest)
  string(FIND "${rest}" "${fence}\n" open)
  if(open EQUAL -1)
    message(FATAL_ERROR "README.md has no ${fence} block under '${heading}'")
  endif()
  string(LENGTH "${fence}\n" fence_length)
  math(EXPR open "${open} + ${fence_length}")
  string(SUBSTRING "${rest}" ${open} -1 rest)
  string(FIND "${rest}" "\n```" close)
  math(EXPR close "${close} + 1")  # keep the block's last newline
  string(SUBSTRING "${rest}" 0 ${close} block)
  file(READ ${PROJECT_DIR}/${file} source)
  string(FIND "${source}" "${block}" found)
  if(found EQUAL -1)
    message(FATAL_ERROR "the README's example under '${heading}' is not verbatim in "
                        "tests/client/install_project/${file}: copy it over")
  endif()
  message(STATUS "${file}: the README's example under '${heading}', verbatim")
endfunction()

check_block("### The local client API" "```cpp" local_client_example.cpp)
check_block("### An engine's paged KV cache" "```cpp" engine_example.cpp)
check_block("### From C" "```c" engine_example.c)

# Fails unless the functions <tensorizer.h> declares TZ_API, the global list of
# the version script and (when LIBRARY and NM are given) the library's dynamic
# symbols are one and the same set: a function missing from the map would be
# declared but not exported, a stray map line would export what the header
# does not promise.
#   cmake -DHEADER=tensorizer.h -DMAP=tensorizer.map [-DLIBRARY=lib -DNM=nm] -P check_abi_symbols.cmake
foreach(var HEADER MAP)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_abi_symbols: ${var} is not set")
  endif()
endforeach()

file(READ "${HEADER}" header)
string(REGEX MATCHALL "TZ_API[^(;]*[ *]tz_[a-z0-9_]+[ ]*\\(" decls "${header}")
set(declared "")
foreach(d IN LISTS decls)
  string(REGEX MATCH "tz_[a-z0-9_]+[ ]*\\($" name "${d}")
  string(REGEX REPLACE "[ ]*\\($" "" name "${name}")
  list(APPEND declared "${name}")
endforeach()
list(LENGTH declared n_declared)
if(n_declared EQUAL 0)
  message(FATAL_ERROR "No TZ_API function found in ${HEADER}")
endif()

file(READ "${MAP}" map)
if(NOT map MATCHES "TENSORIZER_0[ \t\r\n]*{[ \t\r\n]*global:(.*)local:[ \t\r\n]*\\*;[ \t\r\n]*};")
  message(FATAL_ERROR "${MAP} is not one node 'TENSORIZER_0 { global: ...; local: *; };'")
endif()
set(global_block "${CMAKE_MATCH_1}")
# ';' separates CMake list items, so the terminators go before matching.
string(REPLACE ";" " " global_block "${global_block}")
string(REGEX MATCHALL "[A-Za-z0-9_*?]+" mapped "${global_block}")

set(failures "")
foreach(name IN LISTS mapped)
  if(name MATCHES "[*?]")
    string(APPEND failures "\n  ${MAP}: wildcard '${name}' (list each function)")
  endif()
endforeach()
set(sorted_map ${mapped})
list(SORT sorted_map)
if(NOT sorted_map STREQUAL mapped)
  string(APPEND failures "\n  ${MAP}: the global list is not sorted")
endif()
set(dups ${mapped})
list(REMOVE_DUPLICATES dups)
if(NOT dups STREQUAL mapped)
  string(APPEND failures "\n  ${MAP}: a symbol is listed twice")
endif()

# Reports names of `have` that `want` lacks.
function(report_missing have want what)
  foreach(name IN LISTS ${have})
    list(FIND ${want} "${name}" at)
    if(at EQUAL -1)
      string(APPEND failures "\n  ${name}: ${what}")
    endif()
  endforeach()
  set(failures "${failures}" PARENT_SCOPE)
endfunction()

report_missing(declared mapped "declared TZ_API in the header but missing from the map")
report_missing(mapped declared "in the map but not declared TZ_API in the header")

if(DEFINED LIBRARY AND DEFINED NM)
  execute_process(COMMAND "${NM}" -D --defined-only "${LIBRARY}"
                  OUTPUT_VARIABLE nm_out RESULT_VARIABLE nm_rc)
  if(NOT nm_rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${LIBRARY}")
  endif()
  # Lines "ADDR T name" or "ADDR T name@@TENSORIZER_0"; the node itself shows
  # up as an absolute symbol "TENSORIZER_0".
  string(REGEX MATCHALL "[ \t][A-Za-z][ \t]+[A-Za-z0-9_]+" nm_lines "${nm_out}")
  set(exported "")
  foreach(line IN LISTS nm_lines)
    string(REGEX REPLACE ".*[ \t]" "" name "${line}")
    if(NOT name STREQUAL "TENSORIZER_0")
      list(APPEND exported "${name}")
    endif()
  endforeach()
  report_missing(declared exported "declared TZ_API but not exported by ${LIBRARY}")
  report_missing(exported declared "exported by ${LIBRARY} but not declared TZ_API")
endif()

if(failures)
  message(FATAL_ERROR "The C ABI symbol lists disagree:${failures}")
endif()
list(LENGTH mapped n_mapped)
message(STATUS "ABI symbols agree: ${n_declared} functions in the header and ${n_mapped} in the map")

# The configuration page's settings table is `tierswap config --settings` (the structs' settings
# tables in code): a setting added, renamed or redescribed in code fails here until the page's
# copy is regenerated (the block between the page's "settings" markers).
execute_process(COMMAND ${CLI} config --settings OUTPUT_VARIABLE generated RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "`tierswap config --settings` failed (${rc})")
endif()
file(READ ${PAGE} page)
string(FIND "${page}" "<!-- settings:" begin)
string(FIND "${page}" "<!-- end of settings -->" end)
if(begin EQUAL -1 OR end EQUAL -1)
  message(FATAL_ERROR "${PAGE}: the settings markers are missing")
endif()
string(SUBSTRING "${page}" ${begin} -1 rest)
string(FIND "${rest}" "\n" eol)
math(EXPR first "${begin} + ${eol} + 1")
math(EXPR length "${end} - ${first}")
string(SUBSTRING "${page}" ${first} ${length} documented)
if(NOT documented STREQUAL generated)
  file(WRITE ${WORK}/settings-table.md "${generated}")
  message(FATAL_ERROR "${PAGE}'s settings table differs from `tierswap config --settings` "
                      "(written to ${WORK}/settings-table.md): replace the block with it")
endif()

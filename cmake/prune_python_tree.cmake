# Removes the .py files in the assembled package (DEST) that python/chorus (SRC)
# no longer has, so a module moved or deleted in the sources does not live on
# in a build tree that copy_directory only ever adds to.
file(GLOB_RECURSE built RELATIVE ${DEST} ${DEST}/*.py)
foreach(rel IN LISTS built)
  if(NOT EXISTS ${SRC}/${rel})
    file(REMOVE ${DEST}/${rel})
  endif()
endforeach()

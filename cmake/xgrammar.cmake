# XGrammar's C++ core (structured output's grammar engine), built from the
# sources scripts/fetch_xgrammar.sh unpacks from its PyPI source distribution.
# Its own CMakeLists builds Python bindings and adds -Werror/-flto; we build
# only the core library, with our compiler flags and its warnings silenced.
set(XGRAMMAR_VERSION 0.2.9)
set(XGRAMMAR_SOURCE_DIR ${CMAKE_SOURCE_DIR}/.cache/xgrammar-${XGRAMMAR_VERSION})
if(NOT EXISTS ${XGRAMMAR_SOURCE_DIR}/include/xgrammar/xgrammar.h)
  message(FATAL_ERROR "XGrammar ${XGRAMMAR_VERSION} sources are missing from ${XGRAMMAR_SOURCE_DIR}: "
                      "run scripts/fetch_xgrammar.sh (build.sh does)")
endif()
file(GLOB_RECURSE xgrammar_srcs CONFIGURE_DEPENDS ${XGRAMMAR_SOURCE_DIR}/cpp/*.cc)
# The TVM FFI bindings are for Python only.
list(FILTER xgrammar_srcs EXCLUDE REGEX "/cpp/tvm_ffi/")
add_library(xgrammar_core STATIC ${xgrammar_srcs})
set_target_properties(xgrammar_core PROPERTIES CXX_STANDARD 17 POSITION_INDEPENDENT_CODE ON)
# Release code even in debug builds (grammar masks sit on the sampling path); no debug info.
target_compile_options(xgrammar_core PRIVATE -w -O2 -g0)
target_include_directories(xgrammar_core PUBLIC ${XGRAMMAR_SOURCE_DIR}/include)
target_include_directories(xgrammar_core SYSTEM PUBLIC ${XGRAMMAR_SOURCE_DIR}/3rdparty/picojson
                           ${XGRAMMAR_SOURCE_DIR}/3rdparty/dlpack/include)
# Log hooks: src/structured/xgrammar_logging.cpp turns its errors into plain
# exceptions and its warnings into per-compilation reports.
target_compile_definitions(xgrammar_core PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0 XGRAMMAR_ENABLE_INTERNAL_CHECK=0
                           XGRAMMAR_LOG_CUSTOMIZE=1)
target_link_libraries(xgrammar_core PUBLIC Threads::Threads)

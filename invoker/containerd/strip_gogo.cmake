# cmake -DIN=src.proto -DOUT=dst.proto -P strip_gogo.cmake
# containerd's API protos carry Go-only options (gogoproto, containerd's
# fieldpath plugin) behind weak imports, which protoc's C++ generator refuses.
# This copies a proto without them: field numbers, packages and services stay.
file(READ "${IN}" text)
string(REGEX REPLACE "import weak \"[^\"]*\";\n" "" text "${text}")
string(REGEX REPLACE "[ \t]*option \\((gogoproto|containerd\\.plugin)\\.[^;]*;\n" "" text "${text}")
string(REGEX REPLACE " *\\[\\(gogoproto\\.[^]]*\\]" "" text "${text}")
# A C++20 keyword (introspection.proto); the wire is unchanged.
string(REGEX REPLACE "repeated string requires = " "repeated string requires_ = " text "${text}")
file(WRITE "${OUT}" "${text}")

# silt_proto_library(TARGET PROTOS file.proto... [IMPORT_DIRS dir...] [LIBS lib...])
# A library of the protobuf and gRPC code generated from a module's protos
# (MODULE/proto/NAME.proto): build/MODULE/proto/NAME.{pb,grpc.pb}.h, included as
# "MODULE/proto/NAME.pb.h". A proto imports another module's as
# "proto/NAME.proto", with that module's directory in IMPORT_DIRS and its
# library in LIBS.
function(silt_proto_library target)
  cmake_parse_arguments(P "" "" "PROTOS;IMPORT_DIRS;LIBS" ${ARGN})
  add_library(${target} ${P_PROTOS})
  target_link_libraries(${target} PUBLIC gRPC::grpc++ protobuf::libprotobuf ${P_LIBS})
  target_include_directories(${target} PUBLIC ${CMAKE_CURRENT_BINARY_DIR} ${CMAKE_BINARY_DIR})
  protobuf_generate(TARGET ${target} LANGUAGE cpp PROTOC_OUT_DIR ${CMAKE_CURRENT_BINARY_DIR}
    IMPORT_DIRS ${CMAKE_CURRENT_SOURCE_DIR} ${P_IMPORT_DIRS})
  protobuf_generate(TARGET ${target} LANGUAGE grpc
    GENERATE_EXTENSIONS .grpc.pb.h .grpc.pb.cc
    PLUGIN "protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin>"
    PROTOC_OUT_DIR ${CMAKE_CURRENT_BINARY_DIR}
    IMPORT_DIRS ${CMAKE_CURRENT_SOURCE_DIR} ${P_IMPORT_DIRS})
endfunction()

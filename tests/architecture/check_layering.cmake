# cmake -DCLOSURES=FILE -P check_layering.cmake: fails (exit 1) when a library links what its layer forbids.
# A rule: LIBRARY|regex of forbidden link items|why, checked on what LIBRARY links (its whole link closure, what ends
# up in its binaries); "LIBRARY uses|..." is checked on what it may use itself (cmake/Yolo8Layering.cmake: without
# what its dependencies link privately).
set(rules
  "yolo_detect|opencv|^yolo_data$|^yolo8_[a-z_]+$|^yolo_train_core$|^yolo_quota|detection maths is LibTorch only"
  "yolo_train_core|opencv|^yolo_data$|^yolo8_[a-z_]+$|^yolo_quota|the training core never links OpenCV, data or quota"
  "yolo_export|opencv|^yolo_data$|^yolo8_[a-z_]+$|^yolo_train_core$|^yolo_quota|the exporter is models + ONNX: no OpenCV"
  "yolo_models|opencv|^yolo_data$|^yolo_detect$|^yolo_train_core$|^yolo8_[a-z_]+$|models have no OpenCV and no trainer"
  "yolo_data_config|torch|c10|opencv|^yolo_data$|the data config is plain structs: no LibTorch, no OpenCV"
  "yolo_quota_core|torch|c10|opencv|HTTPLIB|httplib|MICROHTTPD|SQLite|sqlite|the quota core has no LibTorch, HTTP or SQLite"
  "yolo_quota_store|torch|c10|opencv|HTTPLIB|httplib|MICROHTTPD|quota storage has no LibTorch and no HTTP"
  "yolo_quota_service|torch|c10|opencv|HTTPLIB|httplib|MICROHTTPD|^yolo_quota_server$|the API router has no LibTorch and no HTTP"
  "yolo_quota_client|torch|c10|opencv|MICROHTTPD|^yolo_quota_server$|the client has no LibTorch and no server"
  "yolo_quota_server|torch|c10|opencv|quotad has no LibTorch"
  "yolo_quota_server uses|SQLite|sqlite|the server reads the database through quota/store (StoreReader), never SQLite itself"
  "yolo_quota_service uses|SQLite|sqlite|the API router reaches the database through quota/store only"
  # trainer/: cli < runtime < plots, batch < mode_support < run < modes (trainer/README.md)
  "yolo8_cli|opencv|^yolo_data$|^yolo8_runtime$|^yolo8_plots$|^yolo8_batch$|^yolo8_mode_support$|^yolo8_run$|^yolo8_modes$|^yolo_quota_server$|the command line is settings and words: no OpenCV, nothing of the trainer above it"
  "yolo8_runtime|opencv|^yolo_data$|^yolo8_plots$|^yolo8_batch$|^yolo8_mode_support$|^yolo8_run$|^yolo8_modes$|^yolo_quota_server$|the runtime has no OpenCV and nothing of the trainer above it"
  "yolo8_plots|^yolo8_cli$|^yolo8_runtime$|^yolo8_batch$|^yolo8_mode_support$|^yolo8_run$|^yolo8_modes$|^yolo_quota|plots draw data: no settings, no runs, no quota"
  "yolo8_batch|opencv|^yolo_data$|^yolo8_plots$|^yolo8_mode_support$|^yolo8_run$|^yolo8_modes$|^yolo_quota_server$|batch sizing is synthetic steps: no OpenCV, so profile runs on a bare GPU machine"
  "yolo8_mode_support|^yolo8_batch$|^yolo8_run$|^yolo8_modes$|^yolo_quota_server$|what the modes share knows no run and no mode"
  "yolo8_run|^yolo8_modes$|^yolo_quota_server$|the training run knows no mode"
  "yolo8_modes|^yolo_quota_server$|the trainer links the quota client, never the server"
)
if(NOT EXISTS "${CLOSURES}")
  message(FATAL_ERROR "no link closures at '${CLOSURES}'")
endif()
file(STRINGS "${CLOSURES}" lines)
set(failures 0)
set(checked 0)
foreach(rule IN LISTS rules)
  string(REPLACE "|" ";" parts "${rule}")
  list(POP_FRONT parts library)
  list(POP_BACK parts why)
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "^${library}:")
      continue()
    endif()
    math(EXPR checked "${checked} + 1")
    string(LENGTH "${library}: " prefix_length)
    string(SUBSTRING "${line}" ${prefix_length} -1 deps)
    string(REPLACE " " ";" deps "${deps}")
    foreach(dep IN LISTS deps)
      foreach(pattern IN LISTS parts)
        if(dep MATCHES "${pattern}")
          if(library MATCHES " uses$")
            message(SEND_ERROR "${library} ${dep}: ${why}")
          else()
            message(SEND_ERROR "${library} links ${dep}: ${why}")
          endif()
          math(EXPR failures "${failures} + 1")
        endif()
      endforeach()
    endforeach()
  endforeach()
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "none of the rules' libraries is in ${CLOSURES}")
endif()
if(failures GREATER 0)
  message(FATAL_ERROR "${failures} layering violation(s)")
endif()
message(STATUS "layering: ${checked} libraries checked, no violation")

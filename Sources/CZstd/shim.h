#ifndef USERSTORE_ZSTD_H
#define USERSTORE_ZSTD_H

/// Debian's libzstd (libzstd-dev): the host log's objects are zstd frames with their own
/// content checksum (docs/design.md, "The host log").
#include <zstd.h>

#endif

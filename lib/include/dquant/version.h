/* dquant — library version. */
#ifndef DQUANT_VERSION_H
#define DQUANT_VERSION_H

#include "dquant/export.h"

#define DQ_VERSION_MAJOR 0
#define DQ_VERSION_MINOR 1
#define DQ_VERSION_PATCH 0
#define DQ_VERSION_STRING "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the library actually linked, "MAJOR.MINOR.PATCH". */
DQ_API const char *dq_version(void);

#ifdef __cplusplus
}
#endif
#endif

/* dquant — symbol visibility. The library is built with -fvisibility=hidden; DQ_API marks the
 * public entry points. */
#ifndef DQUANT_EXPORT_H
#define DQUANT_EXPORT_H

#if defined(DQ_BUILDING_LIB) && defined(__GNUC__)
#define DQ_API __attribute__((visibility("default")))
#else
#define DQ_API
#endif

#endif

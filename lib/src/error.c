#include "dquant/error.h"
#include "dquant/version.h"

const char *dq_strerror(int err)
{
    switch (err) {
#define DQ__ERR_MSG(name, value, msg) \
    case value:                       \
        return msg;
        DQ_ERRNO_MAP(DQ__ERR_MSG)
#undef DQ__ERR_MSG
    default:
        return "unknown error";
    }
}

const char *dq_err_name(int err)
{
    switch (err) {
#define DQ__ERR_NAME(name, value, msg) \
    case value:                        \
        return #name;
        DQ_ERRNO_MAP(DQ__ERR_NAME)
#undef DQ__ERR_NAME
    default:
        return "UNKNOWN";
    }
}

const char *dq_version(void)
{
    return DQ_VERSION_STRING;
}

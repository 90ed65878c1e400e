/* dquant — convenience header: the whole public API of libdquant. */
#ifndef DQUANT_DQUANT_H
#define DQUANT_DQUANT_H

#include "dquant/attention.h"
#include "dquant/codec.h"
#include "dquant/error.h"
#include "dquant/hot.h"
#include "dquant/kvq.h"
#include "dquant/layer.h"
#include "dquant/log.h"
#include "dquant/profile.h"
#include "dquant/types.h"
#include "dquant/version.h"
#include "dquant/vskip.h"

#endif

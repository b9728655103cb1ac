/* plugin.h: loading a collective backend plugin (libvisc_<name>.so). */
#ifndef VISC_DIST_PLUGIN_H
#define VISC_DIST_PLUGIN_H

#include "backend.h"

/* The backend table of libvisc_<name>.so, or NULL with an error that says
 * how to get it. */
const visc_dist_backend *visc_dist_load_plugin(const char *name);

#endif

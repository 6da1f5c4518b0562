int recipe_kernel(void) { return RECIPE_VERSION; }

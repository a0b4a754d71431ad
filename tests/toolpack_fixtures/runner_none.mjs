// Runner module without a factory.
export const nothing = true;

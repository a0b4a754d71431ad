// Exports neither createControllerToolpack nor a default factory.
export const version = 1;

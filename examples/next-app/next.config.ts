import type { NextConfig } from 'next';

const nextConfig: NextConfig = {
  // ratestore loads its native binary with a require() decided at run time: keep it out of the bundle.
  serverExternalPackages: ['ratestore'],
};

export default nextConfig;

export default function Home() {
  return (
    <main>
      <h1>ratestore with Next.js</h1>
      <p>
        <a href="/api/hello">/api/hello</a> is limited by <code>proxy.ts</code>; <a href="/limited">/limited</a> by its
        own route handler.
      </p>
    </main>
  );
}

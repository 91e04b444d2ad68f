// A real OpenID provider for the `lattice` login tests: `oidc-provider` (the certified Node.js
// implementation) with the device authorization grant, the authorization code grant with PKCE
// (a native client redirected to a loopback address), refresh tokens, revocation and RS256 JWT
// access tokens for the Lattice API (audience `lattice`). Its access tokens carry only standard
// claims: sub, iss, aud, exp, scope, client_id, and preferred_username and groups as a site's IdP
// maps them (no `tenant`, no `roles`).
//
//   node idp.mjs serve PORT TTL_S     serves http://127.0.0.1:PORT (access tokens live TTL_S seconds);
//                                     prints "ready" when listening.
//                                     POST /_test/rotate: a new signing key, the old one still
//                                     published (a rotation as IdPs do it; sessions and grants kept)
//   node idp.mjs approve URL LOGIN    the user's browser: opens the device verification URL
//                                     (verification_uri_complete), confirms the code, signs in as LOGIN
//   node idp.mjs authorize URL LOGIN  the user's browser: opens the authorization URL, signs in as
//                                     LOGIN, and prints the address it was sent to (the redirect
//                                     URI with the code), which nothing listens on
import http from 'node:http';
import crypto from 'node:crypto';
import Provider from 'oidc-provider';

const RESOURCE = 'https://lattice.example/api';
const REDIRECT = 'http://127.0.0.1/lattice/callback';
const ACCOUNTS = {
  alice: { groups: ['hpc-users', 'tenant:physics'] },
  olga: { groups: ['tenant:physics', 'lattice-operators'] },
};

// The provider's state (device codes, grants, sessions, refresh tokens), kept across a key rotation
// that builds the provider again. Expiry is the provider's own check of each payload's `exp`.
const store = new Map();
class Adapter {
  constructor(model) { this.model = model; }
  key(id) { return `${this.model}:${id}`; }
  async upsert(id, payload) {
    store.set(this.key(id), payload);
    if (payload.grantId) store.set(`grant:${payload.grantId}:${this.key(id)}`, true);
    if (payload.userCode) store.set(`userCode:${payload.userCode}`, id);
    if (payload.uid) store.set(`uid:${payload.uid}`, id);
  }
  async find(id) { return store.get(this.key(id)); }
  async findByUserCode(code) { return this.find(store.get(`userCode:${code}`)); }
  async findByUid(uid) { return this.find(store.get(`uid:${uid}`)); }
  async consume(id) { store.get(this.key(id)).consumed = Math.floor(Date.now() / 1000); }
  async destroy(id) { store.delete(this.key(id)); }
  async revokeByGrantId(grantId) {
    const prefix = `grant:${grantId}:`;
    for (const k of [...store.keys()]) {
      if (k.startsWith(prefix)) {
        store.delete(k.slice(prefix.length));
        store.delete(k);
      }
    }
  }
}

function newKey(n) {
  const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
  return { ...privateKey.export({ format: 'jwk' }), kid: `key-${n}`, alg: 'RS256', use: 'sig' };
}

function provider(issuer, keys, ttl) {
  const p = new Provider(issuer, {
    adapter: Adapter,
    clients: [{
      client_id: 'lattice',
      token_endpoint_auth_method: 'none',
      application_type: 'native',
      grant_types: ['urn:ietf:params:oauth:grant-type:device_code', 'authorization_code', 'refresh_token'],
      response_types: ['code'],
      redirect_uris: [REDIRECT],
    }],
    jwks: { keys },
    features: {
      devInteractions: { enabled: false },
      deviceFlow: { enabled: true },
      revocation: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => RESOURCE,
        useGrantedResource: () => true,
        getResourceServerInfo: () => ({
          scope: 'admin system:admin tenant:admin operator sensitive:claim readonly',
          audience: 'lattice',
          accessTokenFormat: 'jwt',
          accessTokenTTL: ttl,
          jwt: { sign: { alg: 'RS256' } },
        }),
      },
    },
    findAccount: (_ctx, sub) => (ACCOUNTS[sub] ? { accountId: sub, claims: () => ({ sub }) } : undefined),
    extraTokenClaims: (_ctx, token) =>
      ACCOUNTS[token.accountId]
        ? { preferred_username: token.accountId, groups: ACCOUNTS[token.accountId].groups }
        : undefined,
    ttl: { DeviceCode: 300, RefreshToken: 3600, Grant: 3600, Session: 3600, Interaction: 300 },
  });
  if (process.env.IDP_DEBUG) p.on('grant.error', (_ctx, err) => console.error('grant.error', err, err.error_detail));
  return p;
}

function body(req) {
  return new Promise((resolve) => {
    let s = '';
    req.on('data', (c) => { s += c; });
    req.on('end', () => resolve(new URLSearchParams(s)));
  });
}

async function serve(port, ttl) {
  const issuer = `http://127.0.0.1:${port}`;
  const keys = [newKey(1)];
  let current = provider(issuer, keys, ttl);
  const server = http.createServer(async (req, res) => {
    try {
      const url = new URL(req.url, issuer);
      if (process.env.IDP_DEBUG) console.error(req.method, req.url);
      if (req.method === 'POST' && url.pathname === '/_test/rotate') {
        keys.unshift(newKey(keys.length + 1));
        current = provider(issuer, [...keys], ttl);
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ signing_kid: keys[0].kid }));
        return;
      }
      const m = url.pathname.match(/^\/interaction\/([^/]+)(\/login)?$/);
      if (m) {
        const details = await current.interactionDetails(req, res);
        if (process.env.IDP_DEBUG) console.error(JSON.stringify(details.prompt), JSON.stringify(details.params));
        if (!m[2]) {
          res.writeHead(200, { 'content-type': 'text/html' });
          res.end(`<form method="post" action="/interaction/${details.uid}/login">`
            + '<input name="login"><button type="submit">Sign in</button></form>');
          return;
        }
        const login = (await body(req)).get('login');
        if (!ACCOUNTS[login]) {
          res.writeHead(403);
          res.end('no such user');
          return;
        }
        // First-party client: signing in grants what the CLI asked for.
        const asked = (details.params.scope || '').split(' ').filter(Boolean);
        const grant = new current.Grant({ accountId: login, clientId: details.params.client_id });
        grant.addOIDCScope(asked.filter((s) => s === 'openid' || s === 'offline_access').join(' '));
        grant.addResourceScope(RESOURCE, asked.filter((s) => s !== 'openid' && s !== 'offline_access').join(' '));
        const grantId = await grant.save();
        await current.interactionFinished(req, res, { login: { accountId: login }, consent: { grantId } },
          { mergeWithLastSubmission: false });
        return;
      }
      current.callback()(req, res);
    } catch (e) {
      res.writeHead(500);
      res.end(String(e && e.stack));
    }
  });
  server.listen(port, '127.0.0.1', () => console.log('ready'));
}

// A browser: follows redirects, keeps cookies, submits the one form of each page; a redirect to
// the client's redirect URI ends the walk there (nothing listens on it; the address bar keeps it).
async function browse(start, login) {
  const jar = new Map();
  async function go(url, method = 'GET', form) {
    for (let hops = 0; hops < 20; hops += 1) {
      if (url.startsWith(REDIRECT)) return { url, status: 0, text: '' };
      const r = await fetch(url, {
        method,
        redirect: 'manual',
        headers: {
          cookie: [...jar].map(([k, v]) => `${k}=${v}`).join('; '),
          ...(form ? { 'content-type': 'application/x-www-form-urlencoded' } : {}),
        },
        body: form ? form.toString() : undefined,
      });
      for (const c of r.headers.getSetCookie()) {
        const [kv] = c.split(';');
        const i = kv.indexOf('=');
        jar.set(kv.slice(0, i), kv.slice(i + 1));
      }
      if (r.status >= 300 && r.status < 400) {
        url = new URL(r.headers.get('location'), url).href;
        method = 'GET';
        form = undefined;
        continue;
      }
      return { url, status: r.status, text: await r.text() };
    }
    throw new Error('too many redirects');
  }
  function formOf(page) {
    const f = page.text.match(/<form[^>]*action="([^"]*)"[^>]*>([\s\S]*?)<\/form>/);
    if (!f) throw new Error(`no form at ${page.url} (${page.status}): ${page.text.slice(0, 300)}`);
    const fields = new URLSearchParams();
    for (const i of f[2].matchAll(/<input[^>]*>/g)) {
      const name = i[0].match(/name="([^"]*)"/);
      const value = i[0].match(/value="([^"]*)"/);
      if (name) fields.set(name[1], value ? value[1] : '');
    }
    return { action: new URL(f[1], page.url).href, fields };
  }
  // The code's input and confirmation pages, then the sign-in page, until a page has no form.
  let page = await go(start);
  for (let pages = 0; /<form/.test(page.text); pages += 1) {
    if (pages > 5) throw new Error(`the login does not end: ${page.text.slice(0, 300)}`);
    const f = formOf(page);
    if (f.fields.has('login')) f.fields.set('login', login);
    page = await go(f.action, 'POST', f.fields);
  }
  return page;
}

async function approve(start, login) {
  const page = await browse(start, login);
  if (page.status !== 200 || !/success|signed in|sign-in/i.test(page.text)) {
    throw new Error(`device login not completed (${page.status}): ${page.text.slice(0, 300)}`);
  }
  console.log('approved');
}

async function authorize(start, login) {
  const page = await browse(start, login);
  if (!page.url.startsWith(REDIRECT)) {
    throw new Error(`not sent back to the client (${page.status} ${page.url}): ${page.text.slice(0, 300)}`);
  }
  console.log(page.url);
}

const [mode, a, b] = process.argv.slice(2);
if (mode === 'serve') serve(Number(a), Number(b || 60));
else if (mode === 'approve') approve(a, b).catch((e) => { console.error(String(e)); process.exit(1); });
else if (mode === 'authorize') authorize(a, b).catch((e) => { console.error(String(e)); process.exit(1); });
else { console.error('usage: idp.mjs serve PORT TTL | approve URL LOGIN | authorize URL LOGIN'); process.exit(2); }
